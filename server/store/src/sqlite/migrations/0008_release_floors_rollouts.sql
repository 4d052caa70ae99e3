-- Release floors and rollouts.

    ALTER TABLE nodes ADD COLUMN release_floor INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE rollouts (
        id           TEXT PRIMARY KEY,
        sequence     INTEGER NOT NULL REFERENCES releases(sequence),
        selector     TEXT NOT NULL,
        waves        TEXT NOT NULL,
        max_failures INTEGER NOT NULL,
        state        TEXT NOT NULL,
        wave         INTEGER NOT NULL,
        reason       TEXT NOT NULL DEFAULT '',
        created_at   INTEGER NOT NULL,
        updated_at   INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE rollout_nodes (
        rollout_id  TEXT NOT NULL REFERENCES rollouts(id),
        node_id     TEXT NOT NULL,
        position    INTEGER NOT NULL,
        command_id  TEXT,
        rollback_id TEXT,
        skipped     INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (rollout_id, node_id)
    ) STRICT;
    