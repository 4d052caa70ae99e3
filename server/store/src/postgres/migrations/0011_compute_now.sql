-- The store's clock, compute_now(): the database's own clock, which every
-- gateway and controller reads, so no process's clock decides liveness.
-- A transaction may set bc.now_ms (set_config(..., true)) to override it:
-- tests inject their clock that way. clock_timestamp() rather than now():
-- a transaction that waited for a lock sees the time it got it.
CREATE FUNCTION compute_now() RETURNS BIGINT LANGUAGE sql VOLATILE AS $$
    SELECT COALESCE(NULLIF(current_setting('bc.now_ms', true), '')::BIGINT,
                    floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT)
$$;
