CREATE OR REPLACE FUNCTION outbox.retry_now(
    p_message_ids uuid[],
    p_reason      text,
    p_operator    text DEFAULT NULL)
RETURNS TABLE(message_id uuid, previous_attempt_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- The named messages, by primary key.
SET jit = off
AS $$
-- An operator moves the next attempt of retrying messages (pending, not
-- leased, failed at least once) to now, their attempt count kept, each with
-- a RESCHEDULED attempt naming the operator given, the login and the
-- reason. A message that never failed but is due already is simply taken
-- along (the next claim takes it anyway). All or nothing: a message that is
-- not pending (delivered, discarded, dead, unknown), is leased, is held by a
-- claim or completion right now, or that its producer scheduled for later
-- and that never failed refuses the whole call, SQLSTATE P7005, naming
-- each. A paused message is rescheduled
-- and still waits for the resume; one behind its key's head still waits
-- for the head.
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_ids      uuid[];
    v_previous timestamptz[];
    v_problems text;
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'outbox.retry_now: a reason is required; it is kept in the attempts archive' USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_message_ids), 0) = 0 OR cardinality(p_message_ids) > 10000 THEN
        RAISE EXCEPTION 'outbox.retry_now: name 1 to 10000 messages, got %', coalesce(cardinality(p_message_ids), 0)
            USING ERRCODE = '22023';
    END IF;

    -- Locked without waiting: a claim holding one is about to lease it,
    -- and a completion to move it.
    SELECT array_agg(l.id ORDER BY l.id), array_agg(l.next_attempt_at ORDER BY l.id) INTO v_ids, v_previous
    FROM (SELECT p.id, p.next_attempt_at FROM outbox.pending p
          WHERE p.id = ANY (p_message_ids) AND p.lease_token IS NULL
            AND (p.last_error_code IS NOT NULL OR p.next_attempt_at <= v_now)
          FOR UPDATE SKIP LOCKED) l;

    SELECT string_agg(format('%s %s', u.id, CASE
               WHEN p.id IS NULL AND d.id IS NOT NULL THEN 'is a dead letter: replay it instead'
               WHEN p.id IS NULL THEN 'is not pending (delivered, discarded, or never enqueued)'
               WHEN p.lease_token IS NOT NULL THEN format('is leased by %s until %s', p.claimed_by, p.lease_expires_at)
               WHEN p.last_error_code IS NULL AND p.next_attempt_at > v_now THEN
                   format('never failed: its producer scheduled it for %s, and only a failed message''s next attempt is moved', p.next_attempt_at)
               ELSE 'is being claimed or completed right now: try again'
           END), '; ' ORDER BY u.ord)
      INTO v_problems
      FROM (SELECT DISTINCT ON (x.id) x.id, x.ord FROM unnest(p_message_ids) WITH ORDINALITY AS x(id, ord) ORDER BY x.id, x.ord) u
      LEFT JOIN outbox.pending p ON p.id = u.id
      LEFT JOIN outbox.dead d ON d.id = u.id
      WHERE NOT (u.id = ANY (coalesce(v_ids, '{}')));
    IF v_problems IS NOT NULL THEN
        RAISE EXCEPTION 'outbox.retry_now: nothing rescheduled: %', v_problems
            USING ERRCODE = 'P7005', HINT = 'Only a pending message that failed, or is due already, and is not leased can be retried now.';
    END IF;

    WITH moved AS (
        UPDATE outbox.pending p SET next_attempt_at = v_now
        FROM unnest(v_ids, v_previous) AS l(id, previous)
        WHERE p.id = l.id
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  p.attempt_count, p.last_error_code, p.last_error, l.previous
    )
    INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic, tenant_id, dedupe_key,
                                 ordering_key, sequence_id, error_code, error_message, operator, reason, db_user, note)
    SELECT m.id, m.attempt_count, 'RESCHEDULED', m.namespace, m.topic, m.tenant_id, m.dedupe_key,
           m.ordering_key, m.sequence_id, m.last_error_code, m.last_error,
           coalesce(p_operator, session_user), p_reason, session_user,
           format('next attempt moved from %s to now', m.previous)
    FROM moved m;

    RETURN QUERY SELECT l.id, l.previous FROM unnest(v_ids, v_previous) AS l(id, previous) ORDER BY l.id;
END;
$$;
REVOKE ALL ON FUNCTION outbox.retry_now(p_message_ids uuid[], p_reason text, p_operator text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.retry_now(p_message_ids uuid[], p_reason text, p_operator text) TO outbox_operator;
