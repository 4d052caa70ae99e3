-- Desired state (signed NodeSpecs) and what nodes report applied.

CREATE TABLE node_specs (
    node_id     TEXT PRIMARY KEY REFERENCES nodes(id),
    generation  BIGINT NOT NULL,
    signed      BYTEA NOT NULL,
    assignments TEXT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE TABLE node_state (
    node_id            TEXT PRIMARY KEY REFERENCES nodes(id),
    applied_generation BIGINT NOT NULL,
    sections           TEXT NOT NULL,
    reported_at        BIGINT NOT NULL
);
