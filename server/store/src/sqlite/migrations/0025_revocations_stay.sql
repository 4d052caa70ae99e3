-- A certificate's revocation is never undone (as PostgreSQL's migration
-- 0025, which also lets only the key holder lift a quarantine: SQLite has
-- no database roles to tell it apart by).
CREATE TRIGGER revocation_stays BEFORE UPDATE OF revoked_at, revoke_reason ON node_certs
    WHEN OLD.revoked_at IS NOT NULL
        AND (NEW.revoked_at IS NOT OLD.revoked_at OR NEW.revoke_reason IS NOT OLD.revoke_reason)
BEGIN
    SELECT RAISE(ABORT, 'a certificate revocation is never undone');
END;
