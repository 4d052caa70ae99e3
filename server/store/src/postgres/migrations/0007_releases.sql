-- Signed releases of bcd.

CREATE TABLE releases (
    sequence        BIGINT PRIMARY KEY,
    version         TEXT NOT NULL,
    target          TEXT NOT NULL,
    size            BIGINT NOT NULL,
    sha256          TEXT NOT NULL,
    key_id          TEXT NOT NULL,
    signed_manifest BYTEA NOT NULL,
    "binary"        BYTEA NOT NULL,
    registered_at   BIGINT NOT NULL
);
