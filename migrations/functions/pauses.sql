CREATE OR REPLACE FUNCTION outbox.pauses()
RETURNS TABLE(namespace text, topic text, paused_by text, db_user text, reason text, paused_at timestamptz,
              messages bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- What is paused, by whom and why, and how many pending messages each
    -- pause holds (through pending_paused: it reads only paused messages).
    SELECT z.namespace, z.topic, z.paused_by, z.db_user, z.reason, z.paused_at,
           (SELECT count(*) FROM outbox.pending p
            WHERE p.paused AND p.namespace = z.namespace AND (z.topic = '*' OR p.topic = z.topic))
    FROM outbox.paused z
    ORDER BY z.paused_at, z.namespace, z.topic
$$;
REVOKE ALL ON FUNCTION outbox.pauses() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.pauses() TO outbox_dispatcher, outbox_operator, outbox_reader;
