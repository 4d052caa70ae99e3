-- Gateways revoked by a list the key holder signs (as SQLite's migration
-- 0034): every serving certificate issued to a gateway is recorded, so a
-- revocation can name it, and the newest signed list is kept in one row
-- for the gateways to hand their nodes. A gateway's role reads the list
-- and nothing of the certificates (its grants, bc_store::postgres::grants).
CREATE TABLE gateway_certs (
    sha256 TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    issued_at BIGINT NOT NULL,
    not_after BIGINT NOT NULL
);
CREATE INDEX gateway_certs_by_end ON gateway_certs (not_after);
CREATE TABLE gateway_revocations (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    issued_at BIGINT NOT NULL,
    envelope BYTEA NOT NULL
);
