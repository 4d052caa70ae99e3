-- Join tokens, nodes, their certificates, sessions, inventory, leases,
-- operators and the controllers' own state.

    CREATE TABLE join_tokens (
        id            TEXT PRIMARY KEY,
        secret_sha256 TEXT NOT NULL,
        created_at    INTEGER NOT NULL,
        expires_at    INTEGER NOT NULL,
        uses_total    INTEGER NOT NULL,
        uses_left     INTEGER NOT NULL,
        description   TEXT NOT NULL DEFAULT ''
    ) STRICT;
    CREATE TABLE nodes (
        id                  TEXT PRIMARY KEY,
        hostname            TEXT NOT NULL,
        created_at          INTEGER NOT NULL,
        deleted_at          INTEGER,
        identity_generation INTEGER NOT NULL,
        ramdisk             INTEGER NOT NULL DEFAULT 0,
        join_token          TEXT NOT NULL,
        agent_version       TEXT NOT NULL DEFAULT '',
        conditions          TEXT NOT NULL DEFAULT '[]',
        taints              TEXT NOT NULL DEFAULT '[]'
    ) STRICT;
    CREATE TABLE node_certs (
        serial              TEXT PRIMARY KEY,
        node_id             TEXT NOT NULL REFERENCES nodes(id),
        fingerprint         TEXT NOT NULL UNIQUE,
        identity_generation INTEGER NOT NULL,
        not_before          INTEGER NOT NULL,
        not_after           INTEGER NOT NULL,
        revoked_at          INTEGER,
        revoke_reason       TEXT
    ) STRICT;
    CREATE INDEX node_certs_node ON node_certs(node_id);
    CREATE TABLE node_sessions (
        node_id        TEXT PRIMARY KEY REFERENCES nodes(id),
        epoch          INTEGER NOT NULL,
        gateway_id     TEXT NOT NULL,
        state          TEXT NOT NULL CHECK (state IN ('connected', 'disconnected', 'unreachable')),
        state_since    INTEGER NOT NULL,
        disconnect_cause TEXT NOT NULL DEFAULT '',
        incarnation_id TEXT NOT NULL,
        boot_id        TEXT NOT NULL,
        journal_id     TEXT NOT NULL,
        cert_serial    TEXT NOT NULL,
        connected_at   INTEGER NOT NULL,
        last_seen      INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX node_sessions_gateway ON node_sessions(gateway_id, state);
    CREATE TABLE inventory (
        node_id    TEXT NOT NULL REFERENCES nodes(id),
        section    TEXT NOT NULL,
        sha256     TEXT NOT NULL,
        body       BLOB,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (node_id, section)
    ) STRICT;
    CREATE TABLE leases (
        name       TEXT PRIMARY KEY,
        owner      TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        renewed_at INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE operators (
        id           TEXT PRIMARY KEY,
        token_sha256 TEXT NOT NULL UNIQUE,
        created_at   INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE controller_state (
        name  TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) STRICT;
    