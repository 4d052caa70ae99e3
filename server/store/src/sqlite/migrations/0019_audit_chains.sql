-- The audit history goes on in several hash chains instead of one (see
-- bc_store::audit; as PostgreSQL's migration 0019, where one head let only
-- one audited transaction commit at a time).
--
-- Records go into chain 1 to 16, chosen by their node (their gateway for a
-- record of no node: audit_chain_of(), the store's own function), each
-- chain with its own head. The records sealed so far stay as they are, in
-- chain 0, hashed as before ('bc-audit-v1'); chain 0 takes no more records.
-- Records of chains 1 to 16 hash their chain's number too
-- (audit_hash_v2(), 'bc-audit-v2').

ALTER TABLE audit ADD COLUMN chain INTEGER;
UPDATE audit SET chain = 0 WHERE seq IS NOT NULL;
DROP INDEX audit_seq;
CREATE UNIQUE INDEX audit_chain_seq ON audit(chain, seq);

CREATE TABLE audit_head_0013 AS SELECT seq, hash FROM audit_head WHERE one = 1;
DROP TABLE audit_head;
CREATE TABLE audit_head (
    chain INTEGER PRIMARY KEY CHECK (chain BETWEEN 0 AND 16),
    seq   INTEGER NOT NULL,
    hash  TEXT NOT NULL
) STRICT;
INSERT INTO audit_head (chain, seq, hash) SELECT 0, seq, hash FROM audit_head_0013;
DROP TABLE audit_head_0013;
WITH RECURSIVE c(chain) AS (SELECT 1 UNION ALL SELECT chain + 1 FROM c WHERE chain < 16)
INSERT INTO audit_head (chain, seq, hash)
SELECT chain, 0, '0000000000000000000000000000000000000000000000000000000000000000' FROM c;

DROP TRIGGER audit_chain;
CREATE TRIGGER audit_chain AFTER INSERT ON audit BEGIN
    UPDATE audit SET chain = h.chain, seq = h.seq + 1, prev_hash = h.hash
    FROM audit_head h
    WHERE audit.id = NEW.id AND h.chain = audit_chain_of(NEW.node_id, NEW.gateway_id);
    UPDATE audit SET hash = audit_hash_v2(chain, prev_hash, seq, at, node_id, kind, epoch,
                                          gateway_id, value, detail)
    WHERE id = NEW.id;
    UPDATE audit_head SET seq = a.seq, hash = a.hash
    FROM audit a
    WHERE a.id = NEW.id AND audit_head.chain = a.chain;
END;
