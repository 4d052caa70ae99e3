-- Node-signed facts and what cannot be forged about a node (as SQLite's
-- migration 0012):
-- - a spec's expiry (workers sign a new generation before it), so a replayed
--   old spec is refused by nodes;
-- - the session epoch of the last state report applied, so a report from an
--   older session changes nothing;
-- - the worker-signed statement of a certificate's revocation (or its
--   node's deletion), which gateways relay and nodes obey only when it
--   verifies.
ALTER TABLE node_specs ADD COLUMN not_after BIGINT NOT NULL DEFAULT 0;
ALTER TABLE node_state ADD COLUMN report_epoch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE node_certs ADD COLUMN statement BYTEA;
CREATE INDEX node_specs_not_after ON node_specs(not_after);
