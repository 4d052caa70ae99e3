-- A node's security events (kind security.*) kept where a gateway cannot
-- delete them (as SQLite's migration 0036): a gateway's role inserts each
-- beside node_events and may neither change nor delete one, and the key
-- holder keeps a worker-signed receipt beside it, which the gateway hands
-- on so the node may forget the event. NULL receipt: not judged yet.
-- Receipted events are kept 90 days from their receipt, on the key
-- holder's clock (a gateway cannot insert a receipt time).
CREATE TABLE node_security_events (
    node_id    TEXT NOT NULL REFERENCES nodes(id),
    journal_id TEXT NOT NULL,
    event_id   BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    body       BYTEA NOT NULL,
    at         BIGINT NOT NULL,
    receipt    BYTEA,
    receipted_at BIGINT,
    PRIMARY KEY (node_id, journal_id, event_id)
);
CREATE INDEX node_security_events_unreceipted ON node_security_events (node_id)
    WHERE receipt IS NULL;
