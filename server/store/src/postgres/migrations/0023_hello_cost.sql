-- The sealing trigger's two helpers, audit_chain_of and audit_hash_v2,
-- become inlinable: the same expressions, declared STABLE (convert_to is
-- STABLE, so an IMMUTABLE wrapper is never inlined) and not STRICT
-- (audit_chain_of's CASE is not strict; every column they are called with
-- is NOT NULL, and each expression is NULL on a NULL argument anyway).
-- Declared as migration 0019 had them, PostgreSQL parsed and planned both
-- bodies again in every transaction that sealed a record (every Hello):
-- about a quarter of its time per Hello. Inlined, they are planned once
-- per connection with the trigger's statements. What they compute does
-- not change, so every sealed record still verifies.

CREATE OR REPLACE FUNCTION audit_hash_v2(chain BIGINT, prev TEXT, seq BIGINT, at BIGINT,
                                         node_id TEXT, kind TEXT, epoch BIGINT,
                                         gateway_id TEXT, value BIGINT, detail TEXT)
RETURNS TEXT LANGUAGE sql STABLE AS $$
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

CREATE OR REPLACE FUNCTION audit_chain_of(node_id TEXT, gateway_id TEXT)
RETURNS BIGINT LANGUAGE sql STABLE AS $$
    SELECT 1 + get_byte(sha256(convert_to(
        CASE WHEN node_id = '' THEN gateway_id ELSE node_id END, 'UTF8')), 0)::bigint % 16
$$;

-- A session row's liveness flush changes only last_seen, which no index
-- holds: with room left on the row's page the new version stays there (a
-- heap-only update) and no index gains an entry. On full pages 39 % of
-- node_sessions' updates were heap-only and the rest wrote all three
-- indexes; on pages filled to half, 75 % are (3,000 simulated nodes under
-- `sim --chaos kill`; a Hello or a disconnect changes indexed columns and
-- is never heap-only). New pages are filled to half; pages written before
-- fill as they are rewritten.
ALTER TABLE node_sessions SET (fillfactor = 50);
