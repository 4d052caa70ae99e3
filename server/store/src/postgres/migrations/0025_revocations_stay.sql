-- A certificate's revocation is never undone, and only the key holder
-- lifts a node's quarantine (as SQLite's migration 0025, which has the
-- first rule; it has no database roles for the second). A gateway's role
-- may set revoked_at (a Hello supersedes the certificates a node renewed
-- away from; the clone watch quarantines) and quarantined_at, but clearing
-- either would let a revoked or cloned identity back in through every
-- other gateway.
CREATE FUNCTION revocation_stays() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'certificate % was revoked: a revocation is never undone', OLD.serial
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER revocation_stays BEFORE UPDATE OF revoked_at, revoke_reason ON node_certs
    FOR EACH ROW WHEN (OLD.revoked_at IS NOT NULL
        AND (NEW.revoked_at IS DISTINCT FROM OLD.revoked_at
             OR NEW.revoke_reason IS DISTINCT FROM OLD.revoke_reason))
    EXECUTE FUNCTION revocation_stays();

-- Runs as the caller (not SECURITY DEFINER): the owner of nodes, the key
-- holder, may lift a quarantine (a re-enrolment does); nobody else may.
CREATE FUNCTION quarantine_stays() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID),
                       'MEMBER') THEN
        RAISE EXCEPTION 'node % is quarantined: only the key holder lifts a quarantine', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER quarantine_stays BEFORE UPDATE OF quarantined_at ON nodes
    FOR EACH ROW WHEN (OLD.quarantined_at IS NOT NULL
        AND NEW.quarantined_at IS DISTINCT FROM OLD.quarantined_at)
    EXECUTE FUNCTION quarantine_stays();
