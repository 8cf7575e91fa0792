CREATE OR REPLACE FUNCTION outbox.discard(
    p_message_ids uuid[],
    p_reason      text,
    p_operator    text DEFAULT NULL)
RETURNS TABLE(message_id uuid, discarded_from text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- The named messages, by primary key: see claim_batch.
SET jit = off
AS $$
-- An operator gives up on messages for good: dead letters, and pending
-- messages no dispatcher holds (unleased, or their lease expired). Each gets
-- a DISCARDED attempt naming the operator given, the database login and the
-- reason; a parked key whose dead head is discarded continues with its next
-- message. A message leased right now, or being recorded, is left alone
-- (not returned): try again when its delivery attempt is over.
#variable_conflict use_column
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_out    uuid[];
    v_from   text[];
    v_key_ns text[];
    v_key_ok text[];
    v_free   uuid[];
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'outbox.discard: a reason is required; it is kept in the attempts archive' USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_message_ids), 0) = 0 OR cardinality(p_message_ids) > 10000 THEN
        RAISE EXCEPTION 'outbox.discard: name 1 to 10000 messages, got %', coalesce(cardinality(p_message_ids), 0)
            USING ERRCODE = '22023';
    END IF;

    -- The keys' locks first, as everyone who waits for them does.
    SELECT array_agg(x.namespace), array_agg(x.ordering_key) INTO v_key_ns, v_key_ok
    FROM (SELECT d.namespace, d.ordering_key FROM outbox.dead d WHERE d.id = ANY (p_message_ids) AND d.ordering_key IS NOT NULL
          UNION
          SELECT p.namespace, p.ordering_key FROM outbox.pending p WHERE p.id = ANY (p_message_ids) AND p.ordering_key IS NOT NULL) x;
    PERFORM outbox.lock_keys(v_key_ns, v_key_ok);
    -- And the keys' heads: a claim locks a head to lease it with the run
    -- behind it, whose messages it does not lock (see claim_batch). Once a
    -- claim that holds one commits, the statement below sees its run.
    PERFORM 1 FROM outbox.pending h
    WHERE (h.namespace, h.ordering_key) IN (SELECT * FROM unnest(v_key_ns, v_key_ok)) AND NOT h.behind
    ORDER BY h.namespace, h.ordering_key
    FOR UPDATE OF h;

    -- The pending messages named, unless someone holds one right now (a
    -- completion recording it): it is left alone like a leased one, and
    -- discard never waits for a completion that may be waiting for it.
    v_free := ARRAY(SELECT p.id FROM outbox.pending p WHERE p.id = ANY (p_message_ids)
                    ORDER BY p.id FOR UPDATE OF p SKIP LOCKED);

    WITH from_dead AS (
        DELETE FROM outbox.dead d WHERE d.id = ANY (p_message_ids)
        RETURNING d.id, d.namespace, d.topic, d.tenant_id, d.dedupe_key, d.ordering_key, d.sequence_id,
                  d.attempt_count, d.last_error_code, d.last_error, 'dead' AS origin
    ),
    from_pending AS (
        DELETE FROM outbox.pending p
        WHERE p.id = ANY (v_free) AND (p.lease_token IS NULL OR p.lease_expires_at <= v_now)
          -- Nor a message of a run leased with its head.
          AND NOT EXISTS (SELECT 1 FROM outbox.pending h
                          WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key
                            AND h.sequence_id < p.sequence_id AND h.run_through >= p.sequence_id
                            AND h.lease_expires_at > v_now)
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  p.attempt_count, p.last_error_code, p.last_error, 'pending' AS origin
    ),
    gone AS (
        SELECT * FROM from_dead UNION ALL SELECT * FROM from_pending
    ),
    audited AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic, tenant_id, dedupe_key,
                                     ordering_key, sequence_id, error_code, error_message, operator, reason, db_user)
        SELECT g.id, g.attempt_count, 'DISCARDED', g.namespace, g.topic, g.tenant_id, g.dedupe_key,
               g.ordering_key, g.sequence_id, g.last_error_code, g.last_error,
               coalesce(p_operator, session_user), p_reason, session_user
        FROM gone g
    )
    SELECT array_agg(g.id ORDER BY g.id), array_agg(g.origin ORDER BY g.id),
           array_agg(g.namespace) FILTER (WHERE g.ordering_key IS NOT NULL),
           array_agg(g.ordering_key) FILTER (WHERE g.ordering_key IS NOT NULL)
      INTO v_out, v_from, v_key_ns, v_key_ok
      FROM gone g;

    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, true);
    END IF;
    RETURN QUERY SELECT u.id, u.origin FROM unnest(v_out, v_from) AS u(id, origin);
END;
$$;
REVOKE ALL ON FUNCTION outbox.discard(p_message_ids uuid[], p_reason text, p_operator text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.discard(p_message_ids uuid[], p_reason text, p_operator text) TO outbox_operator;
