-- Version 1: the journal as first written (releases before format versions
-- wrote these tables without a user_version; on such a journal this only
-- stamps the version).
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS commands (
    id         TEXT PRIMARY KEY,
    seq        INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    payload    BLOB NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('accepted', 'running', 'done')),
    boot_id    TEXT NOT NULL DEFAULT '',
    result     BLOB,
    acked      INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS commands_seq ON commands(seq);
CREATE TABLE IF NOT EXISTS events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    kind       TEXT NOT NULL,
    class      TEXT NOT NULL CHECK (class IN ('metric', 'result', 'transition')),
    body       BLOB NOT NULL,
    size       INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS events_class ON events(class, id);
CREATE TABLE IF NOT EXISTS spec (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL,
    signed     BLOB NOT NULL
) STRICT;
