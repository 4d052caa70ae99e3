-- index commands_seq
CREATE INDEX commands_seq ON commands(seq);
-- index events_class
CREATE INDEX events_class ON events(class, id);
-- table commands
CREATE TABLE commands (
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
-- table events
CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    kind       TEXT NOT NULL,
    class      TEXT NOT NULL CHECK (class IN ('metric', 'result', 'transition')),
    body       BLOB NOT NULL,
    size       INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
) STRICT;
-- table meta
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
-- table spec
CREATE TABLE spec (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL,
    signed     BLOB NOT NULL
) STRICT;
