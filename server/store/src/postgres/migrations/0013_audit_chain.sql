-- The audit history becomes a hash chain (see bc_store::audit; as SQLite's
-- migration 0013): each record gets the next sequence number, the hash of
-- the record before it and its own hash, from the chain's head.
--
-- Records are sealed when their transaction commits (a deferred trigger),
-- holding the head's row lock from there to the commit: sequence numbers
-- follow commit order across every gateway, are gapless and never repeat,
-- and a transaction takes the head only after every row lock it needs, so
-- the head adds no lock-order deadlock.

CREATE FUNCTION audit_hash(prev TEXT, seq BIGINT, at BIGINT, node_id TEXT, kind TEXT,
                           epoch BIGINT, gateway_id TEXT, value BIGINT, detail TEXT)
RETURNS TEXT LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(sha256(convert_to(
        'bc-audit-v1' || chr(10) || prev || chr(10) || seq::text || chr(10) || at::text
        || chr(10) || length(node_id)::text || ':' || node_id
        || chr(10) || length(kind)::text || ':' || kind
        || chr(10) || epoch::text
        || chr(10) || length(gateway_id)::text || ':' || gateway_id
        || chr(10) || value::text
        || chr(10) || length(detail)::text || ':' || detail, 'UTF8')), 'hex')
$$;

ALTER TABLE audit ADD COLUMN seq BIGINT;
ALTER TABLE audit ADD COLUMN prev_hash TEXT;
ALTER TABLE audit ADD COLUMN hash TEXT;

CREATE TABLE audit_head (
    one  INTEGER PRIMARY KEY CHECK (one = 1),
    seq  BIGINT NOT NULL,
    hash TEXT NOT NULL
);
INSERT INTO audit_head (one, seq, hash)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');

-- The history written before the chain is sealed in id order.
DO $$
DECLARE
    r RECORD;
    h RECORD;
BEGIN
    FOR r IN SELECT * FROM audit ORDER BY id LOOP
        SELECT seq, hash INTO h FROM audit_head WHERE one = 1;
        UPDATE audit_head
        SET seq = h.seq + 1,
            hash = audit_hash(h.hash, h.seq + 1, r.at, r.node_id, r.kind, r.epoch,
                              r.gateway_id, r.value, r.detail)
        WHERE one = 1;
        UPDATE audit SET seq = h.seq + 1, prev_hash = h.hash,
                         hash = (SELECT hash FROM audit_head WHERE one = 1)
        WHERE id = r.id;
    END LOOP;
END $$;

CREATE UNIQUE INDEX audit_seq ON audit(seq);

CREATE FUNCTION audit_seal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    h RECORD;
    sealed TEXT;
BEGIN
    SELECT seq, hash INTO h FROM audit_head WHERE one = 1 FOR UPDATE;
    sealed := audit_hash(h.hash, h.seq + 1, NEW.at, NEW.node_id, NEW.kind, NEW.epoch,
                         NEW.gateway_id, NEW.value, NEW.detail);
    UPDATE audit SET seq = h.seq + 1, prev_hash = h.hash, hash = sealed WHERE id = NEW.id;
    UPDATE audit_head SET seq = h.seq + 1, hash = sealed WHERE one = 1;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER audit_chain AFTER INSERT ON audit
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_seal();
