-- A node's security event is kept by its kind and the SHA-256 of its body
-- as well as its id (as PostgreSQL's migration 0037), the digest computed
-- by the store (`sha256_hex()`): a row planted under a node's next event id
-- no longer keeps the node's own event out. The key holder receipts each
-- row; the node settles only the one it journaled.
CREATE TABLE node_security_events_by_body (
    node_id      TEXT NOT NULL REFERENCES nodes(id),
    journal_id   TEXT NOT NULL,
    event_id     INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    body         BLOB NOT NULL,
    body_sha256  TEXT NOT NULL,
    at           INTEGER NOT NULL,
    receipt      BLOB,
    receipted_at INTEGER,
    PRIMARY KEY (node_id, journal_id, event_id, kind, body_sha256)
) STRICT;
INSERT INTO node_security_events_by_body
    (node_id, journal_id, event_id, kind, body, body_sha256, at, receipt, receipted_at)
SELECT node_id, journal_id, event_id, kind, body, sha256_hex(body), at, receipt, receipted_at
FROM node_security_events;
DROP TABLE node_security_events;
ALTER TABLE node_security_events_by_body RENAME TO node_security_events;
CREATE INDEX node_security_events_unreceipted ON node_security_events (node_id)
    WHERE receipt IS NULL;
