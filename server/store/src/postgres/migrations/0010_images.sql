-- Netboot images, their artifacts, assignments and recorded boots.

CREATE TABLE images (
    image_id        TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    key_id          TEXT NOT NULL,
    kernel_version  TEXT NOT NULL,
    bcd_version     TEXT NOT NULL,
    cmdline         TEXT NOT NULL,
    kernel_sha256   TEXT NOT NULL,
    kernel_size     BIGINT NOT NULL,
    initrd_sha256   TEXT NOT NULL,
    initrd_size     BIGINT NOT NULL,
    signed_manifest BYTEA NOT NULL,
    registered_at   BIGINT NOT NULL
);
CREATE TABLE image_artifacts (
    sha256 TEXT PRIMARY KEY,
    bytes  BYTEA NOT NULL
);
CREATE TABLE image_assignments (
    target      TEXT PRIMARY KEY,
    image_id    TEXT NOT NULL REFERENCES images(image_id),
    append      TEXT NOT NULL DEFAULT '',
    assigned_at BIGINT NOT NULL
);
CREATE TABLE boots (
    id       BIGSERIAL PRIMARY KEY,
    mac      TEXT NOT NULL,
    image_id TEXT,
    remote   TEXT NOT NULL,
    outcome  TEXT NOT NULL,
    at       BIGINT NOT NULL
);
CREATE INDEX boots_mac ON boots(mac, id);
