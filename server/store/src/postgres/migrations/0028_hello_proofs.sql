-- The node's signed Hello proofs (as SQLite's migration 0028). A gateway's
-- role no longer revokes a certificate or quarantines a node (its grants,
-- bc_store::postgres::grants, lose UPDATE of node_certs.revoked_at and
-- revoke_reason and of nodes.quarantined_at): the key holder supersedes
-- the certificates a node renewed away from and quarantines a cloned
-- identity, both from proofs it verified.
ALTER TABLE cert_sightings ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cert_sightings ADD COLUMN proof BYTEA;
ALTER TABLE cert_sightings ADD COLUMN proof_signature BYTEA;
ALTER TABLE node_sessions ADD COLUMN hello_seq BIGINT NOT NULL DEFAULT 0;
