-- Commands a Hello ended (journal-lost, rebooted) before a Hello's endings
-- kept its proof (migration 0028 and the release with it), as PostgreSQL's
-- migration 0029: listed once with the legacy results, so a reader tells
-- them (the row is all there is, as before the upgrade) from one a
-- gateway wrote with no proof (forged). The list is written once again
-- here, and never after.
DROP TRIGGER legacy_results_written_once;
DROP TRIGGER legacy_results_kept;
INSERT INTO legacy_results (command_id)
SELECT id FROM commands
WHERE ((state = 'failed' AND reason = 'journal-lost')
        OR (state = 'succeeded' AND reason = 'rebooted'))
    AND result_payload IS NULL
    AND id NOT IN (SELECT command_id FROM legacy_results);
CREATE TRIGGER legacy_results_written_once BEFORE INSERT ON legacy_results
BEGIN
    SELECT RAISE(ABORT, 'legacy results are written once, by migrations 0026 and 0029');
END;
CREATE TRIGGER legacy_results_kept BEFORE UPDATE ON legacy_results
BEGIN
    SELECT RAISE(ABORT, 'legacy results are written once, by migrations 0026 and 0029');
END;
