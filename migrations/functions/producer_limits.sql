-- producer_limits answers outbox.limits, the limits enqueue holds every
-- message to, for producers that check a message before they send it (the
-- Go producer's LoadLimits) and may not read the table itself.
CREATE OR REPLACE FUNCTION outbox.producer_limits()
RETURNS TABLE(max_payload_bytes integer, max_key_bytes integer, max_headers integer,
              max_header_value_bytes integer, max_delay interval)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
SELECT l.max_payload_bytes, l.max_key_bytes, l.max_headers, l.max_header_value_bytes, l.max_delay
FROM outbox.limits l
$$;
REVOKE ALL ON FUNCTION outbox.producer_limits() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.producer_limits() TO outbox_producer, outbox_operator, outbox_reader;
