-- The leases of the controllers only the key holder runs (history,
-- rollouts, specs) are the key holder's: a gateway's role, which writes
-- its own gateway lease and those of the keyless controllers (liveness,
-- sweeper), may read them but never take, renew or drop them, so it
-- cannot hold one and stall the key holder's passes. Row security binds
-- every role but the tables' owner, the key holder (as SQLite's
-- migration 0027, which has no roles and changes nothing).
ALTER TABLE leases ENABLE ROW LEVEL SECURITY;
CREATE POLICY leases_read ON leases FOR SELECT USING (true);
CREATE POLICY leases_insert ON leases FOR INSERT
    WITH CHECK (name LIKE 'gateway:%' OR name IN ('controller:liveness', 'controller:sweeper'));
CREATE POLICY leases_update ON leases FOR UPDATE
    USING (name LIKE 'gateway:%' OR name IN ('controller:liveness', 'controller:sweeper'))
    WITH CHECK (name LIKE 'gateway:%' OR name IN ('controller:liveness', 'controller:sweeper'));
CREATE POLICY leases_delete ON leases FOR DELETE
    USING (name LIKE 'gateway:%' OR name IN ('controller:liveness', 'controller:sweeper'));
