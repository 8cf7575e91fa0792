CREATE OR REPLACE FUNCTION outbox.pause(
    p_namespace text,
    p_topic     text DEFAULT NULL,
    p_operator  text DEFAULT NULL,
    p_reason    text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Pauses a namespace (p_topic NULL or '*') or one topic of it: claims skip
-- its messages until outbox.resume. Returns how many pending messages it
-- marked paused. A message being delivered right now is marked too and
-- finishes its attempt; if it is retried, it waits for the resume.
--
-- Marking never waits: a message that a claim or completion holds at this
-- moment is left unmarked, as is one whose producer commits just after
-- the pause. Claims skip such a message all the same (they look the pause
-- up while anything is paused, for heads and for the messages of a run),
-- and the next resume of a topic of the namespace, or a pause after it,
-- marks it; until then a claim reads it without taking it.
-- The marked messages' former entries in the claim index stay until
-- vacuum removes them (autovacuum, within seconds with the settings the
-- README recommends): until then claims step over them, the first marking
-- them dead for those that follow.
DECLARE
    v_topic    text := coalesce(nullif(p_topic, ''), '*');
    v_existing outbox.paused;
    v_marked   bigint;
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'outbox.pause: a reason is required; it is kept in outbox.paused and outbox.operator_log'
            USING ERRCODE = '22023';
    END IF;
    IF p_namespace IS NULL OR NOT outbox.valid_name(p_namespace) THEN
        RAISE EXCEPTION 'outbox.pause: % is not a namespace (1-128 characters of letters, digits and . _ : / -, starting with a letter or digit)',
            coalesce(quote_literal(p_namespace), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF v_topic <> '*' AND NOT outbox.valid_name(v_topic) THEN
        RAISE EXCEPTION 'outbox.pause: % is not a topic (1-128 characters of letters, digits and . _ : / -, starting with a letter or digit; NULL or * for the whole namespace)',
            quote_literal(v_topic) USING ERRCODE = '22023';
    END IF;
    -- The same pause twice keeps its first author and reason, and is
    -- refused: the operator may be about to overwrite someone else's.
    SELECT z.* INTO v_existing FROM outbox.paused z
    WHERE z.namespace = p_namespace AND z.topic IN (v_topic, '*')
    ORDER BY z.topic = '*' DESC LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outbox.pause: %/% is already paused%, by % (login %) since %: %',
            p_namespace, v_existing.topic, CASE WHEN v_existing.topic <> v_topic THEN ' as a whole' ELSE '' END,
            coalesce(v_existing.paused_by, v_existing.db_user), v_existing.db_user, v_existing.paused_at, v_existing.reason
            USING ERRCODE = 'P7005', HINT = 'Resume it first to pause it again with another reason.';
    END IF;
    INSERT INTO outbox.paused (namespace, topic, paused_by, reason)
    VALUES (p_namespace, v_topic, nullif(p_operator, ''), p_reason);

    v_marked := outbox.mark_paused(p_namespace, v_topic);
    PERFORM outbox.record_operator_action('pause', p_namespace || '/' || v_topic, p_operator, p_reason,
        jsonb_build_object('namespace', p_namespace, 'topic', v_topic, 'messages', v_marked));
    RETURN v_marked;
END;
$$;
REVOKE ALL ON FUNCTION outbox.pause(p_namespace text, p_topic text, p_operator text, p_reason text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.pause(p_namespace text, p_topic text, p_operator text, p_reason text) TO outbox_operator;
