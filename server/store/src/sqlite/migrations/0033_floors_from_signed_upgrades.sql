-- A node's release floor rises only where the key holder verified the
-- node's signed upgrade result (as PostgreSQL's migration 0033): a
-- succeeded upgrade waits with floor_judged unset until the key holder
-- judged its result and, when the node signed it, raised the floor. The
-- upgrades that succeeded before raised their floors already.
ALTER TABLE commands ADD COLUMN floor_judged INTEGER NOT NULL DEFAULT 0;
UPDATE commands SET floor_judged = 1 WHERE kind = 'daemon.upgrade' AND state = 'succeeded';
CREATE INDEX commands_floor_unjudged ON commands (id)
    WHERE kind = 'daemon.upgrade' AND state = 'succeeded' AND floor_judged = 0;
