-- A node's release floor rises only where the key holder verified the
-- node's signed upgrade result (as SQLite's migration 0033): a succeeded
-- upgrade waits with floor_judged unset until the key holder judged its
-- result and, when the node signed it, raised the floor. A gateway's role
-- writes neither this column nor nodes.release_floor (its grants,
-- bc_store::postgres::grants). The upgrades that succeeded before raised
-- their floors already.
ALTER TABLE commands ADD COLUMN floor_judged BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE commands SET floor_judged = TRUE WHERE kind = 'daemon.upgrade' AND state = 'succeeded';
CREATE INDEX commands_floor_unjudged ON commands (id)
    WHERE kind = 'daemon.upgrade' AND state = 'succeeded' AND NOT floor_judged;
