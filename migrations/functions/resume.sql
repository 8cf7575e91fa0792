CREATE OR REPLACE FUNCTION outbox.resume(
    p_namespace text,
    p_topic     text DEFAULT NULL,
    p_operator  text DEFAULT NULL,
    p_reason    text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Ends a pause that outbox.pause made (the same namespace and topic):
-- its messages are claimable again, in their old order. Returns how many
-- pending messages it unmarked. A message still covered by another pause
-- (its topic paused on its own) stays paused. Recorded in
-- outbox.operator_log with who had paused it, when and why.
DECLARE
    v_topic  text := coalesce(nullif(p_topic, ''), '*');
    v_pause  outbox.paused;
    v_others text;
    v_n      bigint;
    v_round  bigint;
    v_deadline timestamptz := clock_timestamp() + interval '10 seconds';
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'outbox.resume: a reason is required; it is kept in outbox.operator_log'
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM outbox.paused z WHERE z.namespace = p_namespace AND z.topic = v_topic
    RETURNING z.* INTO v_pause;
    IF NOT FOUND THEN
        SELECT string_agg(z.namespace || '/' || z.topic, ', ' ORDER BY z.namespace, z.topic) INTO v_others
        FROM outbox.paused z WHERE z.namespace = p_namespace;
        RAISE EXCEPTION 'outbox.resume: %/% is not paused%', coalesce(p_namespace, 'NULL'), v_topic,
            CASE WHEN v_others IS NULL THEN '' ELSE '; paused there: ' || v_others END
            USING ERRCODE = 'P7005',
                  HINT = CASE WHEN v_others LIKE '%/*%' THEN 'The namespace is paused as a whole: resume it without a topic.'
                              ELSE 'outbox.pauses() lists what is paused.' END;
    END IF;

    -- Every marked message must be unmarked, or it would stay out of the
    -- claim index for good. Rows someone holds (a completion settling a
    -- key holds them for milliseconds) are taken in a later round rather
    -- than waited for: a resume waiting on a row while holding others
    -- could deadlock with that completion, and the completion might be
    -- the one PostgreSQL aborts.
    v_n := 0;
    LOOP
        UPDATE outbox.pending p SET paused = false
        WHERE p.ctid = ANY (ARRAY(
            SELECT q.ctid FROM outbox.pending q
            WHERE q.paused AND q.namespace = p_namespace AND (v_topic = '*' OR q.topic = v_topic)
              AND NOT outbox.is_paused(q.namespace, q.topic)
            FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS v_round = ROW_COUNT;
        v_n := v_n + v_round;
        EXIT WHEN NOT EXISTS (SELECT 1 FROM outbox.pending q
                              WHERE q.paused AND q.namespace = p_namespace AND (v_topic = '*' OR q.topic = v_topic)
                                AND NOT outbox.is_paused(q.namespace, q.topic));
        IF clock_timestamp() > v_deadline THEN
            RAISE EXCEPTION 'outbox.resume: messages of %/% stayed locked for 10 seconds; nothing was resumed', p_namespace, v_topic
                USING ERRCODE = '55P03', HINT = 'Try again: dispatchers hold a message only while claiming or completing it.';
        END IF;
        PERFORM pg_sleep(0.01);
    END LOOP;
    -- And what a pause still in force missed, marked now.
    IF v_topic = '*' THEN
        PERFORM outbox.mark_paused(z.namespace, z.topic) FROM outbox.paused z WHERE z.namespace = p_namespace;
    END IF;

    PERFORM outbox.record_operator_action('resume', p_namespace || '/' || v_topic, p_operator, p_reason,
        jsonb_build_object('namespace', p_namespace, 'topic', v_topic, 'messages', v_n,
                           'paused_by', v_pause.paused_by, 'paused_db_user', v_pause.db_user,
                           'paused_at', v_pause.paused_at, 'paused_reason', v_pause.reason));
    RETURN v_n;
END;
$$;
REVOKE ALL ON FUNCTION outbox.resume(p_namespace text, p_topic text, p_operator text, p_reason text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.resume(p_namespace text, p_topic text, p_operator text, p_reason text) TO outbox_operator;
