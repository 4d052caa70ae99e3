-- Results a node signed for commands the store does not know (it was
-- restored from a set taken before them), as the node sent them (as
-- PostgreSQL's migration 0039): the key holder verifies each and keeps a
-- worker-signed receipt beside it, so the node may forget the result
-- instead of sending it at every session. Kept by the SHA-256 of the
-- signed bytes too (the store computes it), so a row planted under a
-- command id keeps the node's own out of nothing; at most 1,000 a node
-- (a node cannot fill the store with made-up ones), receipted ones 90 days.
CREATE TABLE unknown_results (
    node_id        TEXT NOT NULL REFERENCES nodes(id),
    command_id     TEXT NOT NULL,
    payload        BLOB NOT NULL,
    signature      BLOB NOT NULL,
    payload_sha256 TEXT NOT NULL,
    at             INTEGER NOT NULL,
    receipt        BLOB,
    receipted_at   INTEGER,
    PRIMARY KEY (node_id, command_id, payload_sha256)
) STRICT;
CREATE INDEX unknown_results_unreceipted ON unknown_results (node_id)
    WHERE receipt IS NULL;
