-- The audit history the invariant checkers read. Triggers record every
-- route, liveness transition, gateway lease write, spec generation, release
-- floor, terminal command state and binding change as it commits, whichever
-- code path wrote it. (Their clock is replaced by compute_now() in 0011.)

    CREATE TABLE audit (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        at         INTEGER NOT NULL,
        node_id    TEXT NOT NULL,
        kind       TEXT NOT NULL,
        epoch      INTEGER NOT NULL DEFAULT 0,
        gateway_id TEXT NOT NULL DEFAULT '',
        value      INTEGER NOT NULL DEFAULT 0,
        detail     TEXT NOT NULL DEFAULT ''
    ) STRICT;
    CREATE INDEX audit_node ON audit(node_id, id);
    CREATE TRIGGER audit_route_new AFTER INSERT ON node_sessions BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'route',
                NEW.epoch, NEW.gateway_id, NEW.last_seen);
    END;
    CREATE TRIGGER audit_route AFTER UPDATE OF epoch, gateway_id ON node_sessions
    WHEN NEW.epoch != OLD.epoch OR NEW.gateway_id != OLD.gateway_id BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'route',
                NEW.epoch, NEW.gateway_id, NEW.last_seen);
    END;
    CREATE TRIGGER audit_liveness AFTER UPDATE OF state ON node_sessions
    WHEN NEW.state != OLD.state AND NEW.state != 'connected' BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value, detail)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, NEW.state,
                NEW.epoch, NEW.gateway_id, NEW.last_seen, NEW.disconnect_cause);
    END;
    CREATE TRIGGER audit_lease_new AFTER INSERT ON leases WHEN NEW.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), '', 'lease', NEW.owner,
                NEW.expires_at);
    END;
    CREATE TRIGGER audit_lease AFTER UPDATE ON leases WHEN NEW.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), '', 'lease', NEW.owner,
                NEW.expires_at);
    END;
    CREATE TRIGGER audit_lease_gone AFTER DELETE ON leases WHEN OLD.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), '', 'lease', OLD.owner, 0);
    END;
    CREATE TRIGGER audit_generation_new AFTER INSERT ON node_specs BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'generation',
                NEW.generation);
    END;
    CREATE TRIGGER audit_generation AFTER UPDATE OF generation ON node_specs
    WHEN NEW.generation != OLD.generation BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'generation',
                NEW.generation);
    END;
    CREATE TRIGGER audit_floor AFTER UPDATE OF release_floor ON nodes
    WHEN NEW.release_floor != OLD.release_floor BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.id, 'floor',
                NEW.release_floor);
    END;
    CREATE TRIGGER audit_result AFTER UPDATE OF state ON commands
    WHEN NEW.state != OLD.state
        AND NEW.state IN ('succeeded', 'failed', 'expired', 'rejected') BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, detail)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'result',
                NEW.epoch, json_object('command', NEW.id, 'kind', NEW.kind,
                    'from', OLD.state, 'state', NEW.state, 'reason', NEW.reason));
    END;
    CREATE TRIGGER audit_binding AFTER UPDATE OF state ON bindings
    WHEN NEW.state != OLD.state BEGIN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), NEW.node_id, 'binding',
                json_object('allocation', NEW.allocation_id, 'state', NEW.state));
    END;
    CREATE TRIGGER audit_binding_gone AFTER DELETE ON bindings BEGIN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (CAST(unixepoch('subsec') * 1000 AS INTEGER), OLD.node_id, 'binding',
                json_object('allocation', OLD.allocation_id, 'state', 'deleted'));
    END;
    