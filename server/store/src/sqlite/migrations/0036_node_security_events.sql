-- A node's security events (kind security.*) kept where a gateway cannot
-- delete them (as PostgreSQL's migration 0036): a gateway stores each
-- beside node_events, and the key holder keeps a worker-signed receipt
-- beside it, which the gateway hands on so the node may forget the event.
-- NULL receipt: not judged yet. Receipted events are kept 90 days from
-- their receipt, on the key holder's clock.
CREATE TABLE node_security_events (
    node_id    TEXT NOT NULL REFERENCES nodes(id),
    journal_id TEXT NOT NULL,
    event_id   INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    body       BLOB NOT NULL,
    at         INTEGER NOT NULL,
    receipt    BLOB,
    receipted_at INTEGER,
    PRIMARY KEY (node_id, journal_id, event_id)
) STRICT;
CREATE INDEX node_security_events_unreceipted ON node_security_events (node_id)
    WHERE receipt IS NULL;
