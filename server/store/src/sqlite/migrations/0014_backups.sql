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
    restore_eligible INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    location         TEXT NOT NULL,
    host             TEXT NOT NULL,
    process          TEXT NOT NULL,
    files            INTEGER NOT NULL DEFAULT 0,
    bytes            INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE TRIGGER audit_backup_new AFTER INSERT ON backups BEGIN
    INSERT INTO audit (at, node_id, kind, value, detail)
    VALUES (compute_now(), '', 'backup', NEW.restore_eligible,
            json_object('backup', NEW.id, 'from', '', 'state', NEW.state,
                        'reason', NEW.reason));
END;
CREATE TRIGGER audit_backup AFTER UPDATE OF state ON backups
WHEN NEW.state != OLD.state BEGIN
    INSERT INTO audit (at, node_id, kind, value, detail)
    VALUES (compute_now(), '', 'backup', NEW.restore_eligible,
            json_object('backup', NEW.id, 'from', OLD.state, 'state', NEW.state,
                        'reason', NEW.reason));
END;
