-- The store's clock is compute_now(), a function every connection registers
-- (it reads the clock the store was opened with), so tests control time and
-- every process computes "now" the same way. The audit triggers of 0009 move
-- to it.
    DROP TRIGGER audit_route_new;
    DROP TRIGGER audit_route;
    DROP TRIGGER audit_liveness;
    DROP TRIGGER audit_lease_new;
    DROP TRIGGER audit_lease;
    DROP TRIGGER audit_lease_gone;
    DROP TRIGGER audit_generation_new;
    DROP TRIGGER audit_generation;
    DROP TRIGGER audit_floor;
    DROP TRIGGER audit_result;
    DROP TRIGGER audit_binding;
    DROP TRIGGER audit_binding_gone;
    CREATE TRIGGER audit_route_new AFTER INSERT ON node_sessions BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
        VALUES (compute_now(), NEW.node_id, 'route',
                NEW.epoch, NEW.gateway_id, NEW.last_seen);
    END;
    CREATE TRIGGER audit_route AFTER UPDATE OF epoch, gateway_id ON node_sessions
    WHEN NEW.epoch != OLD.epoch OR NEW.gateway_id != OLD.gateway_id BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
        VALUES (compute_now(), NEW.node_id, 'route',
                NEW.epoch, NEW.gateway_id, NEW.last_seen);
    END;
    CREATE TRIGGER audit_liveness AFTER UPDATE OF state ON node_sessions
    WHEN NEW.state != OLD.state AND NEW.state != 'connected' BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value, detail)
        VALUES (compute_now(), NEW.node_id, NEW.state,
                NEW.epoch, NEW.gateway_id, NEW.last_seen, NEW.disconnect_cause);
    END;
    CREATE TRIGGER audit_lease_new AFTER INSERT ON leases WHEN NEW.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', NEW.owner,
                NEW.expires_at);
    END;
    CREATE TRIGGER audit_lease AFTER UPDATE ON leases WHEN NEW.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', NEW.owner,
                NEW.expires_at);
    END;
    CREATE TRIGGER audit_lease_gone AFTER DELETE ON leases WHEN OLD.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', OLD.owner, 0);
    END;
    CREATE TRIGGER audit_generation_new AFTER INSERT ON node_specs BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (compute_now(), NEW.node_id, 'generation',
                NEW.generation);
    END;
    CREATE TRIGGER audit_generation AFTER UPDATE OF generation ON node_specs
    WHEN NEW.generation != OLD.generation BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (compute_now(), NEW.node_id, 'generation',
                NEW.generation);
    END;
    CREATE TRIGGER audit_floor AFTER UPDATE OF release_floor ON nodes
    WHEN NEW.release_floor != OLD.release_floor BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (compute_now(), NEW.id, 'floor',
                NEW.release_floor);
    END;
    CREATE TRIGGER audit_result AFTER UPDATE OF state ON commands
    WHEN NEW.state != OLD.state
        AND NEW.state IN ('succeeded', 'failed', 'expired', 'rejected') BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, detail)
        VALUES (compute_now(), NEW.node_id, 'result',
                NEW.epoch, json_object('command', NEW.id, 'kind', NEW.kind,
                    'from', OLD.state, 'state', NEW.state, 'reason', NEW.reason));
    END;
    CREATE TRIGGER audit_binding AFTER UPDATE OF state ON bindings
    WHEN NEW.state != OLD.state BEGIN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (compute_now(), NEW.node_id, 'binding',
                json_object('allocation', NEW.allocation_id, 'state', NEW.state));
    END;
    CREATE TRIGGER audit_binding_gone AFTER DELETE ON bindings BEGIN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (compute_now(), OLD.node_id, 'binding',
                json_object('allocation', OLD.allocation_id, 'state', 'deleted'));
    END;
