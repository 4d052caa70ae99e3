-- A node's security event is kept by its kind and the SHA-256 of its body
-- as well as its id (as SQLite's migration 0037), the digest a column the
-- database computes (a gateway's role cannot write it): a row a gateway
-- plants under a node's next event id no longer keeps the node's own
-- event out. The key holder receipts each row; the node settles only the
-- one it journaled.
ALTER TABLE node_security_events
    ADD COLUMN body_sha256 TEXT GENERATED ALWAYS AS (encode(sha256(body), 'hex')) STORED;
ALTER TABLE node_security_events DROP CONSTRAINT node_security_events_pkey;
ALTER TABLE node_security_events
    ADD PRIMARY KEY (node_id, journal_id, event_id, kind, body_sha256);
