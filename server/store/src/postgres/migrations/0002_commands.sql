-- Commands and each node's next sequence number.

ALTER TABLE nodes ADD COLUMN next_seq BIGINT NOT NULL DEFAULT 1;
CREATE TABLE commands (
    id               TEXT PRIMARY KEY,
    node_id          TEXT NOT NULL REFERENCES nodes(id),
    seq              BIGINT NOT NULL,
    kind             TEXT NOT NULL,
    summary          TEXT NOT NULL,
    signed           BYTEA NOT NULL,
    not_after        BIGINT NOT NULL,
    min_generation   BIGINT NOT NULL DEFAULT 0,
    idempotency_key  TEXT UNIQUE,
    state            TEXT NOT NULL,
    epoch            BIGINT NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    reason           TEXT NOT NULL DEFAULT '',
    exit_code        INTEGER,
    output           BYTEA,
    output_truncated BOOLEAN NOT NULL DEFAULT FALSE,
    result_at        BIGINT,
    UNIQUE (node_id, seq)
);
CREATE INDEX commands_node_state ON commands(node_id, state, seq);
CREATE INDEX commands_state_deadline ON commands(state, not_after);
