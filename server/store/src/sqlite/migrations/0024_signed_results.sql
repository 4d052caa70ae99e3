-- A command's result keeps the bytes its node signed and the signature
-- (as PostgreSQL's migration 0024): whoever reads a result later (commands
-- show, rollouts, check) verifies it against the node's certificates
-- instead of believing the row, which a gateway writes.
ALTER TABLE commands ADD COLUMN result_payload BLOB;
ALTER TABLE commands ADD COLUMN result_signature BLOB;
