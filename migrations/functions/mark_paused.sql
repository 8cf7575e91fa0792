-- mark_paused marks the pending messages of a paused namespace or topic
-- that are not marked yet, skipping those someone holds (see outbox.pause).
-- Not executable by any runtime role.
CREATE OR REPLACE FUNCTION outbox.mark_paused(p_namespace text, p_topic text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    v_n bigint;
BEGIN
    UPDATE outbox.pending p SET paused = true
    WHERE p.ctid = ANY (ARRAY(
        SELECT q.ctid FROM outbox.pending q
        WHERE q.namespace = p_namespace AND (p_topic = '*' OR q.topic = p_topic) AND NOT q.paused
        FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
REVOKE ALL ON FUNCTION outbox.mark_paused(p_namespace text, p_topic text) FROM PUBLIC;
