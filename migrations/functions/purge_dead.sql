CREATE OR REPLACE FUNCTION outbox.purge_dead(
    p_older_than interval,
    p_max_rows   int,
    p_operator   text DEFAULT NULL,
    p_reason     text DEFAULT NULL,
    p_namespace  text DEFAULT NULL,
    p_topic      text DEFAULT NULL)
RETURNS TABLE(purged bigint, remaining bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- An operator gives up on the dead letters that failed longer than
-- p_older_than ago (at least a day: younger ones may not have been looked
-- at yet), of a namespace and topic or all, oldest first, at most
-- p_max_rows. Each gets a DISCARDED attempt naming the operator, the login
-- and the reason (its note says it was purged), as outbox.discard gives;
-- a parked key whose dead head goes continues with its next message. The
-- purge is in outbox.operator_log with its counts. Returns how many went
-- and how many older letters remain (beyond p_max_rows, or held by a
-- replay or discard right now).
#variable_conflict use_column
DECLARE
    v_cutoff  timestamptz := now() - p_older_than;
    v_ids     uuid[];
    v_key_ns  text[];
    v_key_ok  text[];
    v_purged  bigint;
    v_left    bigint;
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'outbox.purge_dead: a reason is required; it is kept in the attempts archive and outbox.operator_log'
            USING ERRCODE = '22023';
    END IF;
    IF p_older_than IS NULL OR p_older_than < interval '1 day' THEN
        RAISE EXCEPTION 'outbox.purge_dead: dead letters are kept at least 1 day, got %', coalesce(p_older_than::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 10000 THEN
        RAISE EXCEPTION 'outbox.purge_dead: p_max_rows must be between 1 and 10000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;

    v_ids := ARRAY(
        SELECT d.id FROM outbox.dead d
        WHERE d.failed_at < v_cutoff
          AND (p_namespace IS NULL OR d.namespace = p_namespace)
          AND (p_topic IS NULL OR d.topic = p_topic)
        ORDER BY d.failed_at, d.id
        LIMIT p_max_rows);

    -- The keys' locks first, as everyone who waits for them does.
    SELECT array_agg(d.namespace), array_agg(d.ordering_key) INTO v_key_ns, v_key_ok
    FROM (SELECT DISTINCT d.namespace, d.ordering_key FROM outbox.dead d
          WHERE d.id = ANY (v_ids) AND d.ordering_key IS NOT NULL) d;
    PERFORM outbox.lock_keys(v_key_ns, v_key_ok);

    WITH picked AS (
        -- A replay or discard of the same letters right now keeps them.
        SELECT d.id FROM outbox.dead d WHERE d.id = ANY (v_ids) FOR UPDATE SKIP LOCKED
    ),
    gone AS (
        DELETE FROM outbox.dead d USING picked WHERE d.id = picked.id RETURNING d.*
    ),
    audited AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic, tenant_id, dedupe_key,
                                     ordering_key, sequence_id, error_code, error_message, operator, reason,
                                     db_user, note)
        SELECT g.id, g.attempt_count, 'DISCARDED', g.namespace, g.topic, g.tenant_id, g.dedupe_key,
               g.ordering_key, g.sequence_id, g.last_error_code, g.last_error,
               coalesce(p_operator, session_user), p_reason, session_user,
               format('purged: dead since %s, older than %s', g.failed_at, p_older_than)
        FROM gone g
    )
    SELECT count(*), array_agg(g.namespace) FILTER (WHERE g.holds_key),
           array_agg(g.ordering_key) FILTER (WHERE g.holds_key)
      INTO v_purged, v_key_ns, v_key_ok
      FROM gone g;

    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, true);
    END IF;

    SELECT count(*) INTO v_left FROM outbox.dead d
    WHERE d.failed_at < v_cutoff
      AND (p_namespace IS NULL OR d.namespace = p_namespace)
      AND (p_topic IS NULL OR d.topic = p_topic);
    PERFORM outbox.record_operator_action('purge_dead', 'outbox.dead', p_operator, p_reason,
        jsonb_strip_nulls(jsonb_build_object('older_than', p_older_than::text, 'cutoff', v_cutoff,
                                             'namespace', p_namespace, 'topic', p_topic, 'max_rows', p_max_rows,
                                             'purged', v_purged, 'remaining', v_left)));
    RETURN QUERY SELECT v_purged, v_left;
END;
$$;
REVOKE ALL ON FUNCTION outbox.purge_dead(p_older_than interval, p_max_rows integer, p_operator text, p_reason text, p_namespace text, p_topic text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.purge_dead(p_older_than interval, p_max_rows integer, p_operator text, p_reason text, p_namespace text, p_topic text) TO outbox_operator;
