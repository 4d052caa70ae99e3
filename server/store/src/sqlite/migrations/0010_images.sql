-- Netboot images, their artifacts, assignments and recorded boots.

    CREATE TABLE images (
        image_id        TEXT PRIMARY KEY,
        name            TEXT NOT NULL,
        key_id          TEXT NOT NULL,
        kernel_version  TEXT NOT NULL,
        bcd_version     TEXT NOT NULL,
        cmdline         TEXT NOT NULL,
        kernel_sha256   TEXT NOT NULL,
        kernel_size     INTEGER NOT NULL,
        initrd_sha256   TEXT NOT NULL,
        initrd_size     INTEGER NOT NULL,
        signed_manifest BLOB NOT NULL,
        registered_at   INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE image_artifacts (
        sha256 TEXT PRIMARY KEY,
        bytes  BLOB NOT NULL
    ) STRICT;
    CREATE TABLE image_assignments (
        target      TEXT PRIMARY KEY,
        image_id    TEXT NOT NULL REFERENCES images(image_id),
        append      TEXT NOT NULL DEFAULT '',
        assigned_at INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE boots (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        mac      TEXT NOT NULL,
        image_id TEXT,
        remote   TEXT NOT NULL,
        outcome  TEXT NOT NULL,
        at       INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX boots_mac ON boots(mac, id);
