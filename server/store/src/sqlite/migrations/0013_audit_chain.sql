-- The audit history becomes a hash chain (see bc_store::audit): each
-- record gets the next sequence number, the hash of the record before it
-- and its own hash, from the chain's head, as it is written. audit_hash()
-- is the store's own function (registered on every connection), the same
-- text PostgreSQL hashes in its migration 0013.

ALTER TABLE audit ADD COLUMN seq INTEGER;
ALTER TABLE audit ADD COLUMN prev_hash TEXT;
ALTER TABLE audit ADD COLUMN hash TEXT;

-- The history written before the chain is sealed in id order.
WITH RECURSIVE chain(id, seq, prev_hash, hash) AS (
    SELECT 0, 0, '', '0000000000000000000000000000000000000000000000000000000000000000'
    UNION ALL
    SELECT a.id, chain.seq + 1, chain.hash,
           audit_hash(chain.hash, chain.seq + 1, a.at, a.node_id, a.kind, a.epoch,
                      a.gateway_id, a.value, a.detail)
    FROM chain JOIN audit a ON a.id = (SELECT min(id) FROM audit WHERE id > chain.id)
)
UPDATE audit SET seq = chain.seq, prev_hash = chain.prev_hash, hash = chain.hash
FROM chain WHERE chain.id = audit.id;

CREATE TABLE audit_head (
    one  INTEGER PRIMARY KEY CHECK (one = 1),
    seq  INTEGER NOT NULL,
    hash TEXT NOT NULL
) STRICT;
INSERT INTO audit_head (one, seq, hash)
SELECT 1, COALESCE(max(seq), 0),
       COALESCE((SELECT hash FROM audit ORDER BY seq DESC LIMIT 1),
                '0000000000000000000000000000000000000000000000000000000000000000')
FROM audit;

CREATE UNIQUE INDEX audit_seq ON audit(seq);

CREATE TRIGGER audit_chain AFTER INSERT ON audit BEGIN
    UPDATE audit SET seq = (SELECT seq + 1 FROM audit_head WHERE one = 1),
                     prev_hash = (SELECT hash FROM audit_head WHERE one = 1)
    WHERE id = NEW.id;
    UPDATE audit SET hash = audit_hash(prev_hash, seq, at, node_id, kind, epoch, gateway_id,
                                       value, detail)
    WHERE id = NEW.id;
    UPDATE audit_head SET seq = seq + 1, hash = (SELECT hash FROM audit WHERE id = NEW.id)
    WHERE one = 1;
END;
