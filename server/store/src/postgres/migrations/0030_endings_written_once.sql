-- A command's ending is written once (as SQLite's migration 0030): once a
-- command is succeeded, failed, expired or rejected, its state and its
-- result columns stay as they were written, whoever writes. The store
-- itself never moves a finished command (`bcd_core::command::apply_result`
-- refuses, and a Hello settles only commands in flight), so this refuses
-- only a rewrite: a gateway's role, which may write a result into a
-- command it relays, turning a finished result into journal-lost or
-- rebooted with a later Hello's proof, or a failure into a success.
CREATE FUNCTION ending_written_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'command % finished %: a finished command''s ending is written once',
        OLD.id, OLD.state USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER ending_written_once BEFORE UPDATE OF state, reason, exit_code, output,
        output_truncated, result_at, result_payload, result_signature ON commands
    FOR EACH ROW WHEN (OLD.state IN ('succeeded', 'failed', 'expired', 'rejected')
        AND (NEW.state IS DISTINCT FROM OLD.state OR NEW.reason IS DISTINCT FROM OLD.reason
             OR NEW.exit_code IS DISTINCT FROM OLD.exit_code
             OR NEW.output IS DISTINCT FROM OLD.output
             OR NEW.output_truncated IS DISTINCT FROM OLD.output_truncated
             OR NEW.result_at IS DISTINCT FROM OLD.result_at
             OR NEW.result_payload IS DISTINCT FROM OLD.result_payload
             OR NEW.result_signature IS DISTINCT FROM OLD.result_signature))
    EXECUTE FUNCTION ending_written_once();
