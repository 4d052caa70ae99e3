-- Results a node signed for commands the store does not know (it was
-- restored from a set taken before them), as the node sent them (as
-- SQLite's migration 0039): the key holder verifies each and keeps a
-- worker-signed receipt beside it, so the node may forget the result
-- instead of sending it at every session. Kept by the SHA-256 of the
-- signed bytes too (a column the database computes), so a row planted
-- under a command id keeps the node's own out of nothing; at most 1,000 a
-- node, receipted ones 90 days. A gateway's role inserts rows and reads
-- receipts; it neither changes nor deletes one.
CREATE TABLE unknown_results (
    node_id        TEXT NOT NULL REFERENCES nodes(id),
    command_id     TEXT NOT NULL,
    payload        BYTEA NOT NULL,
    signature      BYTEA NOT NULL,
    payload_sha256 TEXT GENERATED ALWAYS AS (encode(sha256(payload), 'hex')) STORED,
    at             BIGINT NOT NULL,
    receipt        BYTEA,
    receipted_at   BIGINT,
    PRIMARY KEY (node_id, command_id, payload_sha256)
);
CREATE INDEX unknown_results_unreceipted ON unknown_results (node_id)
    WHERE receipt IS NULL;
