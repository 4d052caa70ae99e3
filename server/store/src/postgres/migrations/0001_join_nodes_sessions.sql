-- Join tokens, nodes, their certificates, sessions, inventory, leases,
-- operators and the controllers' own state. Times are unix milliseconds on
-- the store's clock, compute_now() (0011).

CREATE TABLE join_tokens (
    id            TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    uses_total    BIGINT NOT NULL,
    uses_left     BIGINT NOT NULL,
    description   TEXT NOT NULL DEFAULT ''
);
CREATE TABLE nodes (
    id                  TEXT PRIMARY KEY,
    hostname            TEXT NOT NULL,
    created_at          BIGINT NOT NULL,
    deleted_at          BIGINT,
    identity_generation BIGINT NOT NULL,
    ramdisk             BOOLEAN NOT NULL DEFAULT FALSE,
    join_token          TEXT NOT NULL,
    agent_version       TEXT NOT NULL DEFAULT '',
    conditions          TEXT NOT NULL DEFAULT '[]',
    taints              TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE node_certs (
    serial              TEXT PRIMARY KEY,
    node_id             TEXT NOT NULL REFERENCES nodes(id),
    fingerprint         TEXT NOT NULL UNIQUE,
    identity_generation BIGINT NOT NULL,
    not_before          BIGINT NOT NULL,
    not_after           BIGINT NOT NULL,
    revoked_at          BIGINT,
    revoke_reason       TEXT
);
CREATE INDEX node_certs_node ON node_certs(node_id);
-- The revocation feed reads certificates revoked since its last look.
CREATE INDEX node_certs_revoked ON node_certs(revoked_at) WHERE revoked_at IS NOT NULL;
CREATE TABLE node_sessions (
    node_id          TEXT PRIMARY KEY REFERENCES nodes(id),
    epoch            BIGINT NOT NULL,
    gateway_id       TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('connected', 'disconnected', 'unreachable')),
    state_since      BIGINT NOT NULL,
    disconnect_cause TEXT NOT NULL DEFAULT '',
    incarnation_id   TEXT NOT NULL,
    boot_id          TEXT NOT NULL,
    journal_id       TEXT NOT NULL,
    cert_serial      TEXT NOT NULL,
    connected_at     BIGINT NOT NULL,
    last_seen        BIGINT NOT NULL
);
CREATE INDEX node_sessions_gateway ON node_sessions(gateway_id, state);
-- The liveness sweep reads the sessions that are not connected.
CREATE INDEX node_sessions_away ON node_sessions(state) WHERE state <> 'connected';
CREATE TABLE inventory (
    node_id    TEXT NOT NULL REFERENCES nodes(id),
    section    TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    body       BYTEA,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (node_id, section)
);
CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    renewed_at BIGINT NOT NULL
);
CREATE TABLE operators (
    id           TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL UNIQUE,
    created_at   BIGINT NOT NULL
);
CREATE TABLE controller_state (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
