-- Operators authenticate with client certificates from the operator CA;
-- bearer tokens end here (as SQLite's migration 0016): rows from bearer
-- tokens hold no certificate and are revoked by this migration.
ALTER TABLE operators DROP COLUMN token_sha256;
ALTER TABLE operators
    ADD COLUMN role        TEXT NOT NULL DEFAULT 'admin' CHECK (role IN ('admin', 'read-only')),
    ADD COLUMN cert_sha256 TEXT UNIQUE,
    ADD COLUMN cert_serial TEXT UNIQUE,
    ADD COLUMN not_after   BIGINT,
    ADD COLUMN revoked_at  BIGINT;
ALTER TABLE operators ALTER COLUMN role DROP DEFAULT;
UPDATE operators SET revoked_at = compute_now();
