-- Backup sets. `better-compute backup create` inserts its row CREATING
-- before it takes the dump (so the dump holds it as CREATING, never as
-- complete), and moves it to COMPLETE, restore eligible, once every file
-- and the manifest are on disk; a set whose process died while CREATING
-- is moved to FAILED (MANIFEST_INCOMPLETE) by the next start of serve and
-- never becomes eligible. `host` and `process` name the process writing
-- it; it also renews the lease `backup:<id>` while it writes. Every state
-- a set takes is audited (kind 'backup').
--
-- Migration 0013 is the audit chain's.

CREATE TABLE backups (
    id               TEXT PRIMARY KEY,
    state            TEXT NOT NULL,
    reason           TEXT NOT NULL DEFAULT '',
    restore_eligible BOOLEAN NOT NULL DEFAULT false,
    created_at       BIGINT NOT NULL,
    finished_at      BIGINT,
    location         TEXT NOT NULL,
    host             TEXT NOT NULL,
    process          TEXT NOT NULL,
    files            BIGINT NOT NULL DEFAULT 0,
    bytes            BIGINT NOT NULL DEFAULT 0
);

CREATE FUNCTION audit_backup() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO audit (at, node_id, kind, value, detail)
        VALUES (compute_now(), '', 'backup', CASE WHEN NEW.restore_eligible THEN 1 ELSE 0 END,
                json_build_object('backup', NEW.id, 'from', '', 'state', NEW.state,
                                  'reason', NEW.reason)::text);
    ELSE
        INSERT INTO audit (at, node_id, kind, value, detail)
        VALUES (compute_now(), '', 'backup', CASE WHEN NEW.restore_eligible THEN 1 ELSE 0 END,
                json_build_object('backup', NEW.id, 'from', OLD.state, 'state', NEW.state,
                                  'reason', NEW.reason)::text);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER audit_backup_new AFTER INSERT ON backups
    FOR EACH ROW EXECUTE FUNCTION audit_backup();
CREATE TRIGGER audit_backup AFTER UPDATE OF state ON backups
    FOR EACH ROW WHEN (NEW.state <> OLD.state) EXECUTE FUNCTION audit_backup();
