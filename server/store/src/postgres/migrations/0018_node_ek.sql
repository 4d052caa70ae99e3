-- The TPM endorsement key a node joined by attestation is bound to (as
-- SQLite's migration 0018): one live node per EK; deleting the node frees
-- it.
ALTER TABLE nodes ADD COLUMN ek_sha256 TEXT;
CREATE UNIQUE INDEX nodes_ek_sha256 ON nodes (ek_sha256)
    WHERE ek_sha256 IS NOT NULL AND deleted_at IS NULL;
