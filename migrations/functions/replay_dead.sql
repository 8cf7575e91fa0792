CREATE OR REPLACE FUNCTION outbox.replay_dead(
    p_message_ids   uuid[] DEFAULT NULL,
    p_namespace     text DEFAULT NULL,
    p_topic         text DEFAULT NULL,
    p_error_code    text DEFAULT NULL,
    p_failed_after  timestamptz DEFAULT NULL,
    p_failed_before timestamptz DEFAULT NULL,
    p_max_rows      int DEFAULT 100,
    p_dry_run       boolean DEFAULT true,
    p_operator      text DEFAULT NULL,
    p_reason        text DEFAULT NULL)
RETURNS TABLE(message_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
-- Moves the matching dead letters (oldest first) back to pending with the
-- same id and sequence id, attempt count 0, due now, and archives a
-- REPLAYED attempt naming the operator given, the database login and the
-- reason. An ordered message takes its place in its key's line: a parked
-- key's dead head goes first and the key continues after it; a message whose
-- key moved on without it (on_dead = skip) goes as the key's next message,
-- and its REPLAYED attempt says so.
#variable_conflict use_column
DECLARE
    v_matched uuid[];
    v_key_ns  text[];
    v_key_ok  text[];
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 10000 THEN
        RAISE EXCEPTION 'outbox.replay_dead: p_max_rows must be between 1 and 10000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;

    v_matched := ARRAY(
        SELECT d.id
        FROM outbox.dead d
        WHERE (p_message_ids IS NULL OR d.id = ANY (p_message_ids))
          AND (p_namespace IS NULL OR d.namespace = p_namespace)
          AND (p_topic IS NULL OR d.topic = p_topic)
          AND (p_error_code IS NULL OR d.last_error_code = p_error_code)
          AND (p_failed_after IS NULL OR d.failed_at >= p_failed_after)
          AND (p_failed_before IS NULL OR d.failed_at < p_failed_before)
        ORDER BY d.failed_at, d.id
        LIMIT p_max_rows);

    IF coalesce(p_dry_run, true) THEN
        RETURN QUERY SELECT u.id FROM unnest(v_matched) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord;
        RETURN;
    END IF;

    -- The keys' locks first, as everyone who waits for them does: no
    -- dispatcher holding one of them can then be waiting for these rows.
    SELECT array_agg(d.namespace), array_agg(d.ordering_key) INTO v_key_ns, v_key_ok
    FROM outbox.dead d WHERE d.id = ANY (v_matched) AND d.ordering_key IS NOT NULL;
    PERFORM outbox.lock_keys(v_key_ns, v_key_ok);

    WITH picked AS (
        -- A concurrent replay of the same rows moves each of them once.
        SELECT d.id FROM outbox.dead d WHERE d.id = ANY (v_matched) FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        DELETE FROM outbox.dead d USING picked WHERE d.id = picked.id RETURNING d.*
    ),
    requeued AS (
        INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                    payload, payload_bytes, headers, trace_header, attempt_count, available_at,
                                    next_attempt_at, created_at, last_error_code, last_error, behind, park_on_dead,
                                    paused)
        SELECT m.id, m.namespace, m.topic, m.tenant_id, m.dedupe_key, m.ordering_key, m.sequence_id,
               m.payload, m.payload_bytes, m.headers, m.trace_header, 0, now(), now(), m.created_at,
               m.last_error_code, m.last_error, m.ordering_key IS NOT NULL, m.holds_key,
               -- Replayed into a paused namespace or topic, it waits for
               -- the resume with the rest.
               EXISTS (SELECT 1 FROM outbox.paused z WHERE z.namespace = m.namespace AND z.topic IN (m.topic, '*'))
        FROM moved m
    ),
    -- A replayed message may go below where its key's next head is looked
    -- for (outbox.keys.low_sequence_id); the key's lock is held.
    lowered AS (
        UPDATE outbox.keys k SET low_sequence_id = x.seq
        FROM (SELECT m.namespace, m.ordering_key, min(m.sequence_id) AS seq
              FROM moved m WHERE m.ordering_key IS NOT NULL
              GROUP BY m.namespace, m.ordering_key) x
        WHERE k.namespace = x.namespace AND k.ordering_key = x.ordering_key AND k.low_sequence_id > x.seq
    ),
    audited AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic, tenant_id, dedupe_key,
                                     ordering_key, sequence_id, error_code, error_message, operator, reason,
                                     db_user, note)
        SELECT m.id, m.attempt_count, 'REPLAYED', m.namespace, m.topic, m.tenant_id, m.dedupe_key,
               m.ordering_key, m.sequence_id, m.last_error_code, m.last_error,
               coalesce(p_operator, session_user), p_reason, session_user,
               CASE WHEN m.ordering_key IS NOT NULL AND NOT m.holds_key AND s.last_sequence_id > m.sequence_id THEN
                   format('out of sequence: key %s had moved on to sequence %s without it (on_dead skip); delivered as the key''s next message',
                          m.ordering_key, s.last_sequence_id)
               END
        FROM moved m
        LEFT JOIN outbox.sequences s ON s.namespace = m.namespace AND s.ordering_key = m.ordering_key
    )
    SELECT array_agg(m.namespace) FILTER (WHERE m.ordering_key IS NOT NULL),
           array_agg(m.ordering_key) FILTER (WHERE m.ordering_key IS NOT NULL),
           array_agg(m.id ORDER BY m.failed_at, m.id)
      INTO v_key_ns, v_key_ok, v_matched
      FROM moved m;

    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, true);
    END IF;
    RETURN QUERY SELECT u.id FROM unnest(v_matched) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord;
END;
$$;
REVOKE ALL ON FUNCTION outbox.replay_dead(p_message_ids uuid[], p_namespace text, p_topic text, p_error_code text, p_failed_after timestamp with time zone, p_failed_before timestamp with time zone, p_max_rows integer, p_dry_run boolean, p_operator text, p_reason text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.replay_dead(p_message_ids uuid[], p_namespace text, p_topic text, p_error_code text, p_failed_after timestamp with time zone, p_failed_before timestamp with time zone, p_max_rows integer, p_dry_run boolean, p_operator text, p_reason text) TO outbox_operator;
