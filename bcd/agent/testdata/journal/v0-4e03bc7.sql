PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
INSERT INTO meta VALUES('journal_id','417b50759c643b84ada2f2b76db59787');
INSERT INTO meta VALUES('highest_seq','4');
INSERT INTO meta VALUES('applied_generation','4');
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
INSERT INTO commands VALUES('c-accepted',1,'exec.run',X'7061796c6f61642d31','accepted','',NULL,0,1796047931381);
INSERT INTO commands VALUES('c-running',2,'node.reboot',X'7061796c6f61642d32','running','boot-a',NULL,0,1796047931382);
INSERT INTO commands VALUES('c-done',3,'exec.run',X'7061796c6f61642d33','done','boot-a',X'726573756c742d33',0,1796047931383);
INSERT INTO commands VALUES('c-acked',4,'inventory.refresh',X'7061796c6f61642d34','done','',X'726573756c742d34',1,1796047931384);
CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    kind       TEXT NOT NULL,
    class      TEXT NOT NULL CHECK (class IN ('metric', 'result', 'transition')),
    body       BLOB NOT NULL,
    size       INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
) STRICT;
INSERT INTO events VALUES(1,'command.accepted','transition',X'7b22636f6d6d616e645f6964223a22632d6163636570746564227d',43,1796047931386);
INSERT INTO events VALUES(2,'node.load','metric',X'7b226c6f616431223a302e357d',22,1796047931386);
INSERT INTO events VALUES(3,'command.finished','result',X'7b22636f6d6d616e645f6964223a22632d646f6e65227d',39,1796047931386);
CREATE TABLE spec (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL,
    signed     BLOB NOT NULL
) STRICT;
INSERT INTO spec VALUES(1,5,X'7369676e65642d737065632d35');
DELETE FROM sqlite_sequence;
INSERT INTO sqlite_sequence VALUES('events',3);
CREATE INDEX commands_seq ON commands(seq);
CREATE INDEX events_class ON events(class, id);
COMMIT;
