-- The results that finished before results kept their node's signature
-- (migration 0024), as PostgreSQL's migration 0026: written once, here,
-- so a reader can tell such a result (the row is all there is, as before
-- the upgrade) from one a gateway wrote with no node's signature (forged).
-- Only results older than the first signed one count: a row written
-- unsigned after that is no legacy.
CREATE TABLE legacy_results (
    command_id TEXT PRIMARY KEY
) STRICT;
INSERT INTO legacy_results (command_id)
SELECT id FROM commands
WHERE state IN ('succeeded', 'failed', 'expired', 'rejected')
    AND result_payload IS NULL
    AND (result_at IS NULL
        OR result_at <= COALESCE((SELECT MIN(result_at) FROM commands
                                  WHERE result_payload IS NOT NULL),
                                 9223372036854775807));
CREATE TRIGGER legacy_results_written_once BEFORE INSERT ON legacy_results
BEGIN
    SELECT RAISE(ABORT, 'legacy results are written once, by migration 0026');
END;
CREATE TRIGGER legacy_results_kept BEFORE UPDATE ON legacy_results
BEGIN
    SELECT RAISE(ABORT, 'legacy results are written once, by migration 0026');
END;
