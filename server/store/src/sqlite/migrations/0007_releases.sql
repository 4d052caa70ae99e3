-- Signed releases of bcd.

    CREATE TABLE releases (
        sequence        INTEGER PRIMARY KEY,
        version         TEXT NOT NULL,
        target          TEXT NOT NULL,
        size            INTEGER NOT NULL,
        sha256          TEXT NOT NULL,
        key_id          TEXT NOT NULL,
        signed_manifest BLOB NOT NULL,
        binary          BLOB NOT NULL,
        registered_at   INTEGER NOT NULL
    ) STRICT;
    