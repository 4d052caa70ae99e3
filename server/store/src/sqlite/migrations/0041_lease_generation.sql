-- A lease's generation: the same while one owner renews it in time, one
-- more each time it is taken (new, from another owner, or by its own owner
-- after it ran out). A controller's writes name the generation they run
-- under, so a holder whose lease lapsed writes nothing even if it takes the
-- lease again before its write commits.
ALTER TABLE leases ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
