-- Gateways revoked by a list the key holder signs (as PostgreSQL's
-- migration 0034): every serving certificate issued to a gateway is
-- recorded, so a revocation can name it, and the newest signed list is
-- kept in one row for the gateways to hand their nodes.
CREATE TABLE gateway_certs (
    sha256 TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    issued_at INTEGER NOT NULL,
    not_after INTEGER NOT NULL
);
CREATE INDEX gateway_certs_by_end ON gateway_certs (not_after);
CREATE TABLE gateway_revocations (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    issued_at INTEGER NOT NULL,
    envelope BLOB NOT NULL
);
