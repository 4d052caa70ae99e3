-- Commands a Hello ended (journal-lost, rebooted) before a Hello's endings
-- kept its proof, as SQLite's migration 0029: listed once with the legacy
-- results, so a reader tells them (the row is all there is, as before the
-- upgrade) from one a gateway wrote with no proof (forged). Only the
-- owner, migrating, lifts the trigger for this one list.
ALTER TABLE legacy_results DISABLE TRIGGER legacy_results_written_once;
INSERT INTO legacy_results (command_id)
SELECT id FROM commands
WHERE ((state = 'failed' AND reason = 'journal-lost')
        OR (state = 'succeeded' AND reason = 'rebooted'))
    AND result_payload IS NULL
    AND id NOT IN (SELECT command_id FROM legacy_results);
ALTER TABLE legacy_results ENABLE TRIGGER legacy_results_written_once;
CREATE OR REPLACE FUNCTION legacy_results_written_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'legacy results are written once, by migrations 0026 and 0029';
END $$;
