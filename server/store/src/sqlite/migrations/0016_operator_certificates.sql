-- Operators authenticate with client certificates from the operator CA;
-- bearer tokens end here. A row is one operator: its role, the SHA-256 and
-- serial of the certificate issued to it, when that certificate expires,
-- and when it was revoked. Rows from bearer tokens keep their name and
-- creation time, hold no certificate, and are revoked by this migration:
-- no token is accepted any more.
CREATE TABLE operators_v16 (
    id          TEXT PRIMARY KEY,
    role        TEXT NOT NULL CHECK (role IN ('admin', 'read-only')),
    cert_sha256 TEXT UNIQUE,
    cert_serial TEXT UNIQUE,
    created_at  INTEGER NOT NULL,
    not_after   INTEGER,
    revoked_at  INTEGER
) STRICT;
INSERT INTO operators_v16 (id, role, created_at, revoked_at)
    SELECT id, 'admin', created_at, compute_now() FROM operators;
DROP TABLE operators;
ALTER TABLE operators_v16 RENAME TO operators;
