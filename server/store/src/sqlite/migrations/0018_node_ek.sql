-- The TPM endorsement key a node joined by attestation is bound to (the
-- SHA-256 of the EK's TPMT_PUBLIC, hex): a later attested join of the same
-- EK reclaims the node. One live node per EK; deleting the node frees it.
ALTER TABLE nodes ADD COLUMN ek_sha256 TEXT;
CREATE UNIQUE INDEX nodes_ek_sha256 ON nodes (ek_sha256)
    WHERE ek_sha256 IS NOT NULL AND deleted_at IS NULL;
