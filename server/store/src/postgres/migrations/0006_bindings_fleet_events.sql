-- Attested bindings, their nonces and the fleet's security events.

ALTER TABLE node_certs ADD COLUMN der BYTEA;
CREATE TABLE bindings (
    node_id         TEXT NOT NULL REFERENCES nodes(id),
    allocation_id   TEXT NOT NULL,
    gpus            TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('active', 'lost')),
    spec_generation BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (node_id, allocation_id)
);
CREATE TABLE binding_nonces (
    node_id TEXT NOT NULL,
    nonce   TEXT NOT NULL,
    PRIMARY KEY (node_id, nonce)
);
CREATE TABLE fleet_events (
    id      BIGSERIAL PRIMARY KEY,
    at      BIGINT NOT NULL,
    kind    TEXT NOT NULL,
    node_id TEXT NOT NULL,
    detail  TEXT NOT NULL
);
CREATE INDEX fleet_events_node ON fleet_events(node_id, id);
