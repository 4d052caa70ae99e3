-- Events nodes send from their journals.

CREATE TABLE node_events (
    node_id    TEXT NOT NULL REFERENCES nodes(id),
    journal_id TEXT NOT NULL,
    event_id   BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    body       BYTEA NOT NULL,
    at         BIGINT NOT NULL,
    PRIMARY KEY (node_id, journal_id, event_id)
);
CREATE INDEX node_events_node_at ON node_events(node_id, at, event_id);
