-- Events nodes send from their journals.

    CREATE TABLE node_events (
        node_id    TEXT NOT NULL REFERENCES nodes(id),
        journal_id TEXT NOT NULL,
        event_id   INTEGER NOT NULL,
        kind       TEXT NOT NULL,
        body       BLOB NOT NULL,
        at         INTEGER NOT NULL,
        PRIMARY KEY (node_id, journal_id, event_id)
    ) STRICT;
    