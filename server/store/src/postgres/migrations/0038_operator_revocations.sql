-- An operator's revocation as the key holder signed it (a worker-signed
-- OperatorRevocation naming the certificate), beside the row (as SQLite's
-- migration 0038): a key holder refuses the certificate it names from when
-- it reads it and remembers it in its data directory, so a revocation
-- cleared from the store opens nothing there again. A gateway's role reads
-- no operator row.
ALTER TABLE operators ADD COLUMN revocation BYTEA;
