-- The audit history the invariant checkers read. Triggers record every
-- route, liveness transition, gateway lease write, spec generation, release
-- floor, terminal command state and binding change as it commits, whichever
-- code path wrote it, stamped with compute_now() (0011).
--
-- Ids come from a sequence, assigned when the row is written: two writes
-- that must be ordered (a Hello and a renewal of the lease it checked, two
-- Hellos of one node) hold row locks that order them, so their history
-- rows are ordered too.

CREATE TABLE audit (
    id         BIGSERIAL PRIMARY KEY,
    at         BIGINT NOT NULL,
    node_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    epoch      BIGINT NOT NULL DEFAULT 0,
    gateway_id TEXT NOT NULL DEFAULT '',
    value      BIGINT NOT NULL DEFAULT 0,
    detail     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_node ON audit(node_id, id);

CREATE FUNCTION audit_route() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
    VALUES (compute_now(), NEW.node_id, 'route', NEW.epoch, NEW.gateway_id, NEW.last_seen);
    RETURN NULL;
END $$;
CREATE TRIGGER audit_route_new AFTER INSERT ON node_sessions
    FOR EACH ROW EXECUTE FUNCTION audit_route();
CREATE TRIGGER audit_route AFTER UPDATE OF epoch, gateway_id ON node_sessions
    FOR EACH ROW WHEN (NEW.epoch <> OLD.epoch OR NEW.gateway_id <> OLD.gateway_id)
    EXECUTE FUNCTION audit_route();

CREATE FUNCTION audit_liveness() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value, detail)
    VALUES (compute_now(), NEW.node_id, NEW.state, NEW.epoch, NEW.gateway_id, NEW.last_seen,
            NEW.disconnect_cause);
    RETURN NULL;
END $$;
CREATE TRIGGER audit_liveness AFTER UPDATE OF state ON node_sessions
    FOR EACH ROW WHEN (NEW.state <> OLD.state AND NEW.state <> 'connected')
    EXECUTE FUNCTION audit_liveness();

CREATE FUNCTION audit_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', OLD.owner, 0);
    ELSE
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', NEW.owner, NEW.expires_at);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER audit_lease_new AFTER INSERT ON leases
    FOR EACH ROW WHEN (NEW.name LIKE 'gateway:%') EXECUTE FUNCTION audit_lease();
CREATE TRIGGER audit_lease AFTER UPDATE ON leases
    FOR EACH ROW WHEN (NEW.name LIKE 'gateway:%') EXECUTE FUNCTION audit_lease();
CREATE TRIGGER audit_lease_gone AFTER DELETE ON leases
    FOR EACH ROW WHEN (OLD.name LIKE 'gateway:%') EXECUTE FUNCTION audit_lease();

CREATE FUNCTION audit_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (at, node_id, kind, value)
    VALUES (compute_now(), NEW.node_id, 'generation', NEW.generation);
    RETURN NULL;
END $$;
CREATE TRIGGER audit_generation_new AFTER INSERT ON node_specs
    FOR EACH ROW EXECUTE FUNCTION audit_generation();
CREATE TRIGGER audit_generation AFTER UPDATE OF generation ON node_specs
    FOR EACH ROW WHEN (NEW.generation <> OLD.generation) EXECUTE FUNCTION audit_generation();

CREATE FUNCTION audit_floor() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (at, node_id, kind, value)
    VALUES (compute_now(), NEW.id, 'floor', NEW.release_floor);
    RETURN NULL;
END $$;
CREATE TRIGGER audit_floor AFTER UPDATE OF release_floor ON nodes
    FOR EACH ROW WHEN (NEW.release_floor <> OLD.release_floor) EXECUTE FUNCTION audit_floor();

CREATE FUNCTION audit_result() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (at, node_id, kind, epoch, detail)
    VALUES (compute_now(), NEW.node_id, 'result', NEW.epoch,
            json_build_object('command', NEW.id, 'kind', NEW.kind, 'from', OLD.state,
                              'state', NEW.state, 'reason', NEW.reason)::text);
    RETURN NULL;
END $$;
CREATE TRIGGER audit_result AFTER UPDATE OF state ON commands
    FOR EACH ROW WHEN (NEW.state <> OLD.state
        AND NEW.state IN ('succeeded', 'failed', 'expired', 'rejected'))
    EXECUTE FUNCTION audit_result();

CREATE FUNCTION audit_binding() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (compute_now(), OLD.node_id, 'binding',
                json_build_object('allocation', OLD.allocation_id, 'state', 'deleted')::text);
    ELSE
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (compute_now(), NEW.node_id, 'binding',
                json_build_object('allocation', NEW.allocation_id, 'state', NEW.state)::text);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER audit_binding AFTER UPDATE OF state ON bindings
    FOR EACH ROW WHEN (NEW.state <> OLD.state) EXECUTE FUNCTION audit_binding();
CREATE TRIGGER audit_binding_gone AFTER DELETE ON bindings
    FOR EACH ROW EXECUTE FUNCTION audit_binding();
