CREATE OR REPLACE FUNCTION outbox.open_breakers()
RETURNS TABLE(target text, opened_at timestamptz, probe_at timestamptz, failures int, last_error text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- The circuit breakers that are open now: which target, since when,
    -- why (the last error) and when the next probe is due.
    SELECT b.target, b.opened_at, b.probe_at, b.failures, b.last_error
    FROM outbox.breakers b
    WHERE b.opened_at IS NOT NULL
    ORDER BY b.opened_at, b.target
$$;
REVOKE ALL ON FUNCTION outbox.open_breakers() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.open_breakers() TO outbox_dispatcher, outbox_operator, outbox_reader;
