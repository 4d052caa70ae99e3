-- Attested bindings, their nonces and the fleet's security events.

    ALTER TABLE node_certs ADD COLUMN der BLOB;
    CREATE TABLE bindings (
        node_id         TEXT NOT NULL REFERENCES nodes(id),
        allocation_id   TEXT NOT NULL,
        gpus            TEXT NOT NULL,
        state           TEXT NOT NULL CHECK (state IN ('active', 'lost')),
        spec_generation INTEGER NOT NULL,
        updated_at      INTEGER NOT NULL,
        PRIMARY KEY (node_id, allocation_id)
    ) STRICT;
    CREATE TABLE binding_nonces (
        node_id TEXT NOT NULL,
        nonce   TEXT NOT NULL,
        PRIMARY KEY (node_id, nonce)
    ) STRICT;
    CREATE TABLE fleet_events (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        at      INTEGER NOT NULL,
        kind    TEXT NOT NULL,
        node_id TEXT NOT NULL,
        detail  TEXT NOT NULL
    ) STRICT;
    CREATE INDEX fleet_events_node ON fleet_events(node_id, id);
    