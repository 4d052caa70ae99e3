-- Desired state (signed NodeSpecs) and what nodes report applied.

    CREATE TABLE node_specs (
        node_id     TEXT PRIMARY KEY REFERENCES nodes(id),
        generation  INTEGER NOT NULL,
        signed      BLOB NOT NULL,
        assignments TEXT NOT NULL,
        updated_at  INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE node_state (
        node_id            TEXT PRIMARY KEY REFERENCES nodes(id),
        applied_generation INTEGER NOT NULL,
        sections           TEXT NOT NULL,
        reported_at        INTEGER NOT NULL
    ) STRICT;
    