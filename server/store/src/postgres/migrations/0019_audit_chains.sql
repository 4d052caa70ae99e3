-- The audit history goes on in several hash chains instead of one (see
-- bc_store::audit; as SQLite's migration 0019). Migration 0013's single
-- head was taken FOR UPDATE by every audited transaction as it committed
-- and held through the commit, so only one audited transaction (every
-- Hello among them) could commit at a time, each waiting for the one
-- before it to reach the disk.
--
-- Records go into chain 1 to 16, chosen by their node (their gateway for a
-- record of no node, audit_chain_of), each chain with its own head. The
-- records sealed so far stay as they are, in chain 0, hashed as before
-- ('bc-audit-v1'); chain 0 takes no more records. Records of chains 1 to
-- 16 hash their chain's number too ('bc-audit-v2').
--
-- A transaction that writes to several chains takes their heads in chain
-- order, all at its first record's sealing, so two such transactions
-- cannot wait for each other.

CREATE FUNCTION audit_hash_v2(chain BIGINT, prev TEXT, seq BIGINT, at BIGINT, node_id TEXT,
                              kind TEXT, epoch BIGINT, gateway_id TEXT, value BIGINT,
                              detail TEXT)
RETURNS TEXT LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(sha256(convert_to(
        'bc-audit-v2' || chr(10) || chain::text
        || chr(10) || prev || chr(10) || seq::text || chr(10) || at::text
        || chr(10) || length(node_id)::text || ':' || node_id
        || chr(10) || length(kind)::text || ':' || kind
        || chr(10) || epoch::text
        || chr(10) || length(gateway_id)::text || ':' || gateway_id
        || chr(10) || value::text
        || chr(10) || length(detail)::text || ':' || detail, 'UTF8')), 'hex')
$$;

-- bc_store::audit::chain_of: SHA-256 of the node's id (the gateway's for a
-- record of no node), its first byte modulo 16, plus one.
CREATE FUNCTION audit_chain_of(node_id TEXT, gateway_id TEXT)
RETURNS BIGINT LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT 1 + get_byte(sha256(convert_to(
        CASE WHEN node_id = '' THEN gateway_id ELSE node_id END, 'UTF8')), 0)::bigint % 16
$$;

ALTER TABLE audit ADD COLUMN chain BIGINT;
UPDATE audit SET chain = 0 WHERE seq IS NOT NULL;
DROP INDEX audit_seq;
CREATE UNIQUE INDEX audit_chain_seq ON audit(chain, seq);
-- What the sealing trigger looks for: this transaction's records not yet
-- sealed.
CREATE INDEX audit_unsealed ON audit(id) WHERE seq IS NULL;

CREATE TEMPORARY TABLE audit_head_0013 ON COMMIT DROP AS
SELECT seq, hash FROM audit_head WHERE one = 1;
DROP TABLE audit_head;
CREATE TABLE audit_head (
    chain BIGINT PRIMARY KEY CHECK (chain BETWEEN 0 AND 16),
    seq   BIGINT NOT NULL,
    hash  TEXT NOT NULL
);
INSERT INTO audit_head (chain, seq, hash) SELECT 0, seq, hash FROM audit_head_0013;
INSERT INTO audit_head (chain, seq, hash)
SELECT c, 0, '0000000000000000000000000000000000000000000000000000000000000000'
FROM generate_series(1, 16) AS c;

CREATE OR REPLACE FUNCTION audit_seal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c BIGINT := audit_chain_of(NEW.node_id, NEW.gateway_id);
    h RECORD;
    sealed TEXT;
BEGIN
    -- Every head this transaction's records need, in chain order (held
    -- already from its first record on). Records are sealed in the order
    -- they were written, so this transaction's unsealed ones (the only
    -- unsealed ones it sees but any written around the store) start at
    -- this one.
    PERFORM 1 FROM audit_head
    WHERE chain IN (SELECT audit_chain_of(a.node_id, a.gateway_id) FROM audit a
                    WHERE a.seq IS NULL AND a.id >= NEW.id)
    ORDER BY chain FOR UPDATE;
    SELECT seq, hash INTO h FROM audit_head WHERE chain = c FOR UPDATE;
    sealed := audit_hash_v2(c, h.hash, h.seq + 1, NEW.at, NEW.node_id, NEW.kind, NEW.epoch,
                            NEW.gateway_id, NEW.value, NEW.detail);
    UPDATE audit SET chain = c, seq = h.seq + 1, prev_hash = h.hash, hash = sealed
    WHERE id = NEW.id;
    UPDATE audit_head SET seq = h.seq + 1, hash = sealed WHERE chain = c;
    RETURN NULL;
END $$;
