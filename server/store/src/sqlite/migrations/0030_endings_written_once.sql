-- A command's ending is written once (as PostgreSQL's migration 0030):
-- once a command is succeeded, failed, expired or rejected, its state and
-- its result columns stay as they were written. The store itself never
-- moves a finished command (`bcd_core::command::apply_result` refuses,
-- and a Hello settles only commands in flight), so this refuses only a
-- rewrite: a finished result turned journal-lost or rebooted with a later
-- Hello's proof, a failure turned success.
CREATE TRIGGER ending_written_once BEFORE UPDATE OF state, reason, exit_code, output,
        output_truncated, result_at, result_payload, result_signature ON commands
    WHEN OLD.state IN ('succeeded', 'failed', 'expired', 'rejected')
        AND (NEW.state IS NOT OLD.state OR NEW.reason IS NOT OLD.reason
             OR NEW.exit_code IS NOT OLD.exit_code OR NEW.output IS NOT OLD.output
             OR NEW.output_truncated IS NOT OLD.output_truncated
             OR NEW.result_at IS NOT OLD.result_at
             OR NEW.result_payload IS NOT OLD.result_payload
             OR NEW.result_signature IS NOT OLD.result_signature)
BEGIN
    SELECT RAISE(ABORT, 'a finished command''s ending is written once');
END;
