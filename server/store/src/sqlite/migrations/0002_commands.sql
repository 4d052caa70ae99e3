-- Commands and each node's next sequence number.

    ALTER TABLE nodes ADD COLUMN next_seq INTEGER NOT NULL DEFAULT 1;
    CREATE TABLE commands (
        id               TEXT PRIMARY KEY,
        node_id          TEXT NOT NULL REFERENCES nodes(id),
        seq              INTEGER NOT NULL,
        kind             TEXT NOT NULL,
        summary          TEXT NOT NULL,
        signed           BLOB NOT NULL,
        not_after        INTEGER NOT NULL,
        min_generation   INTEGER NOT NULL DEFAULT 0,
        idempotency_key  TEXT UNIQUE,
        state            TEXT NOT NULL,
        epoch            INTEGER NOT NULL DEFAULT 0,
        created_at       INTEGER NOT NULL,
        updated_at       INTEGER NOT NULL,
        reason           TEXT NOT NULL DEFAULT '',
        exit_code        INTEGER,
        output           BLOB,
        output_truncated INTEGER NOT NULL DEFAULT 0,
        result_at        INTEGER,
        UNIQUE (node_id, seq)
    ) STRICT;
    CREATE INDEX commands_node_state ON commands(node_id, state, seq);
    CREATE INDEX commands_state_deadline ON commands(state, not_after);
    