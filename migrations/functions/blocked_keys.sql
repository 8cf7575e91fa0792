CREATE OR REPLACE FUNCTION outbox.blocked_keys(
    p_namespace text DEFAULT NULL,
    p_limit     int DEFAULT 100)
RETURNS TABLE(namespace text, ordering_key text, state text, since timestamptz, message_id uuid,
              sequence_id bigint, topic text, attempt_count int, error_code text, error text, waiting bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Blocked keys (see blocked_key_states), longest blocked first. waiting
    -- counts the key's other pending messages: those queued behind the
    -- message it waits on.
    SELECT b.namespace, b.ordering_key, b.state, b.since, b.message_id, b.sequence_id, b.topic, b.attempt_count,
           b.error_code, b.error,
           (SELECT count(*) FROM outbox.pending w
            WHERE w.namespace = b.namespace AND w.ordering_key = b.ordering_key AND w.id IS DISTINCT FROM b.message_id)
    FROM outbox.blocked_key_states(p_namespace) b
    ORDER BY b.since, b.namespace, b.ordering_key
    LIMIT greatest(coalesce(p_limit, 100), 1)
$$;
REVOKE ALL ON FUNCTION outbox.blocked_keys(p_namespace text, p_limit integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.blocked_keys(p_namespace text, p_limit integer) TO outbox_dispatcher, outbox_operator, outbox_reader;
