-- Release floors and rollouts.

ALTER TABLE nodes ADD COLUMN release_floor BIGINT NOT NULL DEFAULT 0;
CREATE TABLE rollouts (
    id           TEXT PRIMARY KEY,
    sequence     BIGINT NOT NULL REFERENCES releases(sequence),
    selector     TEXT NOT NULL,
    waves        TEXT NOT NULL,
    max_failures BIGINT NOT NULL,
    state        TEXT NOT NULL,
    wave         BIGINT NOT NULL,
    reason       TEXT NOT NULL DEFAULT '',
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
CREATE TABLE rollout_nodes (
    rollout_id  TEXT NOT NULL REFERENCES rollouts(id),
    node_id     TEXT NOT NULL,
    position    BIGINT NOT NULL,
    command_id  TEXT,
    rollback_id TEXT,
    skipped     BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (rollout_id, node_id)
);
