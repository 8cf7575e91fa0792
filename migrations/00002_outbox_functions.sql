-- The outbox state machine. These SECURITY DEFINER functions are the only
-- legal writers of the outbox tables; each pins search_path so that objects a
-- caller creates elsewhere are never picked up. The transitions are drawn in
-- shared/lease/doc.go. Every outcome appends one row to outbox.attempts.
--
-- SQLSTATEs: P7002 lease lost (outbox.complete), P7003 invalid completion
-- (bad outcome or result document), 22023 an argument out of range, P0001
-- an UPDATE or DELETE on the append-only attempts archive.

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION outbox.enqueue(
    p_namespace    text,
    p_topic        text,
    p_payload      jsonb,
    p_tenant_id    text DEFAULT NULL,
    p_dedupe_key   text DEFAULT NULL,
    p_ordering_key text DEFAULT NULL,
    p_headers      jsonb DEFAULT '{}',
    p_trace_header text DEFAULT NULL,
    p_available_at timestamptz DEFAULT now())
RETURNS TABLE(message_id uuid, sequence_id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id        uuid := outbox.uuid_v7();
    v_seq       bigint;
    v_available timestamptz := greatest(coalesce(p_available_at, now()), now());
BEGIN
    IF p_dedupe_key IS NOT NULL THEN
        -- Claim the key first: on a conflict nothing at all is written.
        -- A concurrent enqueue of the same key waits here for the other
        -- transaction and then sees its row (READ COMMITTED).
        INSERT INTO outbox.dedupe (namespace, topic, dedupe_key, message_id)
        VALUES (p_namespace, p_topic, p_dedupe_key, v_id)
        ON CONFLICT ON CONSTRAINT dedupe_pkey DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY
                SELECT d.message_id, d.sequence_id, false
                FROM outbox.dedupe d
                WHERE d.namespace = p_namespace AND d.topic = p_topic AND d.dedupe_key = p_dedupe_key;
            RETURN;
        END IF;
    END IF;

    IF p_ordering_key IS NOT NULL THEN
        -- The row lock on the key's sequence serialises its producers until
        -- commit, so sequence order is also commit order.
        INSERT INTO outbox.sequences AS s (ordering_key, last_sequence_id)
        VALUES (p_ordering_key, 1)
        ON CONFLICT ON CONSTRAINT sequences_pkey
            DO UPDATE SET last_sequence_id = s.last_sequence_id + 1, updated_at = now()
        RETURNING s.last_sequence_id INTO v_seq;
        IF p_dedupe_key IS NOT NULL THEN
            UPDATE outbox.dedupe d SET sequence_id = v_seq
            WHERE d.namespace = p_namespace AND d.topic = p_topic AND d.dedupe_key = p_dedupe_key;
        END IF;
    END IF;

    INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                payload, headers, trace_header, available_at, next_attempt_at)
    VALUES (v_id, p_namespace, p_topic, p_tenant_id, p_dedupe_key, p_ordering_key, v_seq,
            p_payload, coalesce(p_headers, '{}'::jsonb), p_trace_header, v_available, v_available);

    RETURN QUERY SELECT v_id, v_seq, true;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.enqueue_batch(
    p_namespaces    text[],
    p_topics        text[],
    p_payloads      text[],
    p_tenant_ids    text[] DEFAULT NULL,
    p_dedupe_keys   text[] DEFAULT NULL,
    p_ordering_keys text[] DEFAULT NULL,
    p_headers       text[] DEFAULT NULL,
    p_trace_headers text[] DEFAULT NULL,
    p_available_at  timestamptz[] DEFAULT NULL)
RETURNS TABLE(message_id uuid, sequence_id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- A generic plan made while the tables were small would keep scanning
-- dedupe in full as it grows; plan each statement for the data at hand.
SET plan_cache_mode = force_custom_plan
AS $$
-- The set-based form of enqueue() for many messages at once: the same
-- results, in input order, for a fraction of the per-row cost. Element i of
-- every array describes message i; optional arrays may be NULL. Within one
-- batch the first message with a dedupe key wins it and later ones are
-- dedupe hits, exactly as with enqueue() called in order. Keys are locked in
-- sorted order, so concurrent batches sharing keys cannot deadlock.
#variable_conflict use_column
DECLARE
    v_n        int := coalesce(cardinality(p_namespaces), 0);
    v_now      timestamptz := now();
    v_ids      uuid[];
    v_inserted boolean[];
    v_seqs     bigint[];
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_topics), 0) <> v_n OR coalesce(cardinality(p_payloads), 0) <> v_n
       OR coalesce(cardinality(p_tenant_ids), v_n) <> v_n OR coalesce(cardinality(p_dedupe_keys), v_n) <> v_n
       OR coalesce(cardinality(p_ordering_keys), v_n) <> v_n OR coalesce(cardinality(p_headers), v_n) <> v_n
       OR coalesce(cardinality(p_trace_headers), v_n) <> v_n OR coalesce(cardinality(p_available_at), v_n) <> v_n THEN
        RAISE EXCEPTION 'outbox.enqueue_batch: every array must have one element per message (% messages)', v_n
            USING ERRCODE = '22023';
    END IF;

    v_ids := ARRAY(SELECT outbox.uuid_v7() FROM generate_series(1, v_n));

    -- 1. Claim the dedupe keys, in key order; the lowest position wins a key
    --    repeated within the batch.
    IF p_dedupe_keys IS NOT NULL THEN
        INSERT INTO outbox.dedupe (namespace, topic, dedupe_key, message_id)
        SELECT e.ns, e.tp, e.dk, e.id
        FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_ids) WITH ORDINALITY AS e(ns, tp, dk, id, ord)
        WHERE e.dk IS NOT NULL
        ORDER BY e.ns, e.tp, e.dk, e.ord
        ON CONFLICT ON CONSTRAINT dedupe_pkey DO NOTHING;

        -- A new statement, so a new snapshot: keys that a concurrent
        -- transaction committed while we waited on them are visible here.
        v_inserted := ARRAY(
            SELECT d.message_id IS NULL OR d.message_id = e.id
            FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_ids) WITH ORDINALITY AS e(ns, tp, dk, id, ord)
            LEFT JOIN LATERAL (
                -- OFFSET 0 keeps this a per-message primary key probe: a
                -- hash join over the whole table is what stale statistics
                -- would choose on a table that grows by the batch.
                SELECT k.message_id FROM outbox.dedupe k
                WHERE k.namespace = e.ns AND k.topic = e.tp AND k.dedupe_key = e.dk OFFSET 0) d ON true
            ORDER BY e.ord);
    ELSE
        v_inserted := array_fill(true, ARRAY[v_n]);
    END IF;

    -- 2. Sequence ids for the inserted messages with an ordering key: each
    --    key's allocator moves once by its count, in key order.
    IF p_ordering_keys IS NOT NULL THEN
        WITH e AS (
            SELECT x.ok, x.ord, row_number() OVER (PARTITION BY x.ok ORDER BY x.ord) AS rank
            FROM unnest(p_ordering_keys, v_inserted) WITH ORDINALITY AS x(ok, ins, ord)
            WHERE x.ok IS NOT NULL AND x.ins
        ),
        counts AS (
            SELECT e.ok, count(*) AS n FROM e GROUP BY e.ok
        ),
        bumped AS (
            INSERT INTO outbox.sequences AS s (ordering_key, last_sequence_id)
            SELECT c.ok, c.n FROM counts c ORDER BY c.ok
            ON CONFLICT ON CONSTRAINT sequences_pkey
                DO UPDATE SET last_sequence_id = s.last_sequence_id + excluded.last_sequence_id, updated_at = now()
            RETURNING s.ordering_key, s.last_sequence_id
        )
        SELECT array_agg(CASE WHEN e.ok IS NULL THEN NULL ELSE b.last_sequence_id - c.n + e.rank END ORDER BY g.ord)
        INTO v_seqs
        FROM generate_series(1, v_n) AS g(ord)
        LEFT JOIN e ON e.ord = g.ord
        LEFT JOIN counts c ON c.ok = e.ok
        LEFT JOIN bumped b ON b.ordering_key = e.ok;

        IF p_dedupe_keys IS NOT NULL THEN
            UPDATE outbox.dedupe d SET sequence_id = x.seq
            FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_seqs, v_inserted) AS x(ns, tp, dk, seq, ins)
            WHERE x.ins AND x.dk IS NOT NULL AND x.seq IS NOT NULL
              AND (d.namespace, d.topic, d.dedupe_key) = (x.ns, x.tp, x.dk);
        END IF;
    END IF;

    -- 3. The messages themselves.
    INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                payload, headers, trace_header, available_at, next_attempt_at)
    SELECT x.id, x.ns, x.tp, x.tenant, x.dk, x.ok, x.seq, x.payload::jsonb, coalesce(x.headers::jsonb, '{}'::jsonb),
           x.trace, greatest(coalesce(x.at, v_now), v_now), greatest(coalesce(x.at, v_now), v_now)
    FROM unnest(v_ids, p_namespaces, p_topics, p_tenant_ids, p_dedupe_keys, p_ordering_keys, v_seqs,
                p_payloads, p_headers, p_trace_headers, p_available_at, v_inserted)
         AS x(id, ns, tp, tenant, dk, ok, seq, payload, headers, trace, at, ins)
    WHERE x.ins;

    -- 4. One row per message, in order; a dedupe hit answers with the
    --    message that holds the key.
    RETURN QUERY
    SELECT CASE WHEN x.ins THEN x.id ELSE d.message_id END,
           CASE WHEN x.ins THEN x.seq ELSE d.sequence_id END,
           x.ins
    FROM unnest(v_ids, p_namespaces, p_topics, p_dedupe_keys, v_seqs, v_inserted) WITH ORDINALITY
         AS x(id, ns, tp, dk, seq, ins, ord)
    LEFT JOIN LATERAL (
        SELECT k.message_id, k.sequence_id FROM outbox.dedupe k
        WHERE NOT x.ins AND k.namespace = x.ns AND k.topic = x.tp AND k.dedupe_key = x.dk OFFSET 0) d ON true
    ORDER BY x.ord;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.claim_batch(
    p_batch_size    int,
    p_worker_id     text,
    p_lease_seconds int,
    p_namespaces    text[] DEFAULT NULL)
RETURNS TABLE(id uuid, namespace text, topic text, tenant_id text, dedupe_key text,
              ordering_key text, sequence_id bigint, payload jsonb, headers jsonb,
              trace_header text, attempt_count int, lease_token uuid,
              lease_expires_at timestamptz, created_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- A generic plan cannot see the LIMIT and falls back to a sequential scan
-- and sort; a custom plan walks pending_claimable in order and stops.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 10000 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_batch_size must be between 1 and 10000, got %', p_batch_size
            USING ERRCODE = '22023';
    END IF;
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_worker_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF p_lease_seconds IS NULL OR p_lease_seconds < 1 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_lease_seconds must be at least 1, got %', p_lease_seconds
            USING ERRCODE = '22023';
    END IF;

    RETURN QUERY
    WITH candidate AS (
        SELECT p.id
        FROM outbox.pending p
        WHERE p.lease_token IS NULL
          AND p.next_attempt_at <= now()
          AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
          -- Only the head of an ordering key (its lowest sequence_id still
          -- pending, leased or not) may be claimed.
          AND (p.ordering_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM outbox.pending head
                WHERE head.ordering_key = p.ordering_key
                  AND head.sequence_id < p.sequence_id))
        ORDER BY p.next_attempt_at, p.id
        LIMIT p_batch_size
        FOR UPDATE OF p SKIP LOCKED
    )
    UPDATE outbox.pending p
    SET claimed_by       = p_worker_id,
        lease_token      = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        attempt_count    = p.attempt_count + 1
    FROM candidate c
    WHERE p.id = c.id
    RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
              p.payload, p.headers, p.trace_header, p.attempt_count, p.lease_token,
              p.lease_expires_at, p.created_at;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.complete_batch(
    p_worker_id    text,
    p_results      jsonb,
    p_max_attempts int DEFAULT 100)
RETURNS TABLE(id uuid, status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_total    int;
    v_distinct int;
    v_invalid  int;
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_worker_id must not be empty' USING ERRCODE = 'P7003';
    END IF;
    IF jsonb_typeof(p_results) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_results must be a JSON array of results' USING ERRCODE = 'P7003';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_max_attempts must be at least 1' USING ERRCODE = '22023';
    END IF;

    -- Validate the whole document before writing anything: a malformed
    -- completion is a bug in the caller and must not half-apply. This block
    -- only reads, so its subtransaction never takes a transaction id.
    BEGIN
        SELECT count(*),
               count(DISTINCT r.id),
               count(*) FILTER (WHERE r.id IS NULL OR r.lease_token IS NULL OR r.outcome IS NULL
                                   OR r.outcome NOT IN ('DISPATCHED', 'RETRYABLE', 'FAILED'))
          INTO v_total, v_distinct, v_invalid
          FROM jsonb_to_recordset(p_results) AS r(id uuid, lease_token uuid, outcome text,
                                                  latency_ms int, retry_at timestamptz);
    EXCEPTION WHEN invalid_text_representation OR invalid_parameter_value OR datatype_mismatch
                OR invalid_datetime_format OR datetime_field_overflow OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'outbox.complete_batch: malformed result document: %', SQLERRM USING ERRCODE = 'P7003';
    END;
    IF v_invalid > 0 THEN
        RAISE EXCEPTION 'outbox.complete_batch: % result(s) without id, lease_token or a valid outcome (DISPATCHED, RETRYABLE, FAILED)', v_invalid
            USING ERRCODE = 'P7003';
    END IF;
    IF v_distinct <> v_total THEN
        RAISE EXCEPTION 'outbox.complete_batch: a message id appears more than once in one batch' USING ERRCODE = 'P7003';
    END IF;

    -- The DELETE and the UPDATE are the fence: each touches only rows still
    -- leased to this worker under the result's token and not yet expired.
    -- A row that a reaper or another worker changed meanwhile fails the
    -- re-check PostgreSQL makes after waiting for its lock, and is left
    -- alone; it reports lease_lost.
    RETURN QUERY
    WITH r AS (
        SELECT *
        FROM ROWS FROM (jsonb_to_recordset(p_results) AS (
                 id uuid, lease_token uuid, outcome text, error_code text, error_message text,
                 target text, target_ref text, latency_ms int, retry_at timestamptz))
             WITH ORDINALITY AS r(id, lease_token, outcome, error_code, error_message,
                                  target, target_ref, latency_ms, retry_at, ord)
    ),
    -- DISPATCHED and FAILED leave pending; so does a RETRYABLE outcome at
    -- the attempt ceiling, which becomes FAILED.
    removed AS (
        DELETE FROM outbox.pending p
        USING r
        WHERE p.id = r.id
          AND p.lease_token = r.lease_token
          AND p.claimed_by = p_worker_id
          AND p.lease_expires_at > now()
          AND (r.outcome <> 'RETRYABLE' OR p.attempt_count >= p_max_attempts)
        -- A delivered row's payload is not needed past this point: carrying
        -- it through the CTEs costs more than the delete itself.
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.payload END AS payload,
                  CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.headers END AS headers,
                  p.trace_header, p.attempt_count, p.available_at, p.created_at,
                  r.outcome AS requested,
                  CASE WHEN r.outcome = 'DISPATCHED' THEN 'DISPATCHED' ELSE 'FAILED' END AS outcome,
                  r.error_code, left(r.error_message, 4096) AS error_message, r.target, r.target_ref, r.latency_ms
    ),
    rescheduled AS (
        UPDATE outbox.pending p
        SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_attempt_at = greatest(coalesce(r.retry_at, now()), now()),
            last_error_code = r.error_code,
            last_error = left(r.error_message, 4096)
        FROM r
        WHERE p.id = r.id
          AND p.lease_token = r.lease_token
          AND p.claimed_by = p_worker_id
          AND p.lease_expires_at > now()
          AND r.outcome = 'RETRYABLE' AND p.attempt_count < p_max_attempts
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  p.attempt_count, r.error_code, left(r.error_message, 4096) AS error_message,
                  r.target, r.target_ref, r.latency_ms
    ),
    buried AS (
        INSERT INTO outbox.dead (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                 payload, headers, trace_header, attempt_count, available_at, created_at,
                                 last_error_code, last_error, failed_by)
        SELECT x.id, x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id,
               x.payload, x.headers, x.trace_header, x.attempt_count, x.available_at, x.created_at,
               x.error_code, x.error_message, p_worker_id
        FROM removed x
        WHERE x.outcome = 'FAILED'
    ),
    archived AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                     dedupe_key, ordering_key, sequence_id, target, target_ref,
                                     error_code, error_message, latency_ms)
        SELECT x.id, x.attempt_count, x.outcome, p_worker_id, x.namespace, x.topic, x.tenant_id,
               x.dedupe_key, x.ordering_key, x.sequence_id, x.target, x.target_ref,
               x.error_code, x.error_message, x.latency_ms
        FROM removed x
        UNION ALL
        SELECT q.id, q.attempt_count, 'RETRYABLE', p_worker_id, q.namespace, q.topic, q.tenant_id,
               q.dedupe_key, q.ordering_key, q.sequence_id, q.target, q.target_ref,
               q.error_code, q.error_message, q.latency_ms
        FROM rescheduled q
    ),
    done AS (
        SELECT x.id, CASE WHEN x.requested = 'RETRYABLE' THEN 'dead' ELSE 'ok' END AS status FROM removed x
        UNION ALL
        SELECT q.id, 'ok' FROM rescheduled q
    )
    SELECT r.id, coalesce(d.status, 'lease_lost')
    FROM r
    LEFT JOIN done d ON d.id = r.id
    ORDER BY r.ord;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.complete(
    p_worker_id     text,
    p_id            uuid,
    p_lease_token   uuid,
    p_outcome       text,
    p_error_code    text DEFAULT NULL,
    p_error_message text DEFAULT NULL,
    p_target        text DEFAULT NULL,
    p_target_ref    text DEFAULT NULL,
    p_latency_ms    int DEFAULT NULL,
    p_retry_at      timestamptz DEFAULT NULL,
    p_max_attempts  int DEFAULT 100)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status text;
BEGIN
    SELECT c.status INTO v_status
    FROM outbox.complete_batch(
        p_worker_id,
        jsonb_build_array(jsonb_build_object(
            'id', p_id, 'lease_token', p_lease_token, 'outcome', p_outcome,
            'error_code', p_error_code, 'error_message', p_error_message,
            'target', p_target, 'target_ref', p_target_ref,
            'latency_ms', p_latency_ms, 'retry_at', p_retry_at)),
        p_max_attempts) AS c;
    IF v_status = 'lease_lost' THEN
        RAISE EXCEPTION 'LEASE_LOST: message % is no longer leased to % under that token', p_id, p_worker_id
            USING ERRCODE = 'P7002';
    END IF;
    RETURN v_status;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.repair_expired_leases(
    p_batch_size   int,
    p_worker_id    text,
    p_max_attempts int DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_repaired integer;
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 100000 THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_batch_size must be between 1 and 100000, got %', p_batch_size
            USING ERRCODE = '22023';
    END IF;
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_worker_id must not be empty' USING ERRCODE = '22023';
    END IF;

    WITH expired AS (
        SELECT p.id, p.claimed_by AS held_by
        FROM outbox.pending p
        WHERE p.lease_token IS NOT NULL
          AND p.lease_expires_at <= now()
        ORDER BY p.lease_expires_at
        LIMIT p_batch_size
        FOR UPDATE OF p SKIP LOCKED
    ),
    requeued AS (
        UPDATE outbox.pending p
        SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_attempt_at = now(),
            last_error_code = 'LEASE_EXPIRED',
            last_error = 'lease held by ' || e.held_by || ' expired before completion'
        FROM expired e
        WHERE p.id = e.id AND p.attempt_count < p_max_attempts
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  p.attempt_count, e.held_by
    ),
    -- A message whose every attempt ends in a crash (it kills the
    -- dispatcher, or outlives the lease) must not loop for ever.
    removed AS (
        DELETE FROM outbox.pending p
        USING expired e
        WHERE p.id = e.id AND p.attempt_count >= p_max_attempts
        RETURNING p.*, e.held_by
    ),
    buried AS (
        INSERT INTO outbox.dead (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                 payload, headers, trace_header, attempt_count, available_at, created_at,
                                 last_error_code, last_error, failed_by)
        SELECT x.id, x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id,
               x.payload, x.headers, x.trace_header, x.attempt_count, x.available_at, x.created_at,
               'LEASE_EXPIRED',
               'lease held by ' || x.held_by || ' expired on attempt ' || x.attempt_count
                   || ', the attempt ceiling; moved to dead',
               p_worker_id
        FROM removed x
    ),
    archived AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                     dedupe_key, ordering_key, sequence_id, error_code, error_message)
        SELECT q.id, q.attempt_count, 'ZOMBIE_REQUEUE', p_worker_id, q.namespace, q.topic, q.tenant_id,
               q.dedupe_key, q.ordering_key, q.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || q.held_by || ' expired before completion'
        FROM requeued q
        UNION ALL
        SELECT x.id, x.attempt_count, 'FAILED', p_worker_id, x.namespace, x.topic, x.tenant_id,
               x.dedupe_key, x.ordering_key, x.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || x.held_by || ' expired on attempt ' || x.attempt_count
                   || ', the attempt ceiling; moved to dead'
        FROM removed x
    )
    SELECT (SELECT count(*) FROM requeued) + (SELECT count(*) FROM removed) INTO v_repaired;
    RETURN v_repaired;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.replay_dead(
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
#variable_conflict use_column
DECLARE
    v_matched uuid[];
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

    RETURN QUERY
    WITH picked AS (
        -- A concurrent replay of the same rows moves each of them once.
        SELECT d.id FROM outbox.dead d WHERE d.id = ANY (v_matched) FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        DELETE FROM outbox.dead d USING picked WHERE d.id = picked.id RETURNING d.*
    ),
    requeued AS (
        INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                    payload, headers, trace_header, attempt_count, available_at,
                                    next_attempt_at, created_at, last_error_code, last_error)
        SELECT m.id, m.namespace, m.topic, m.tenant_id, m.dedupe_key, m.ordering_key, m.sequence_id,
               m.payload, m.headers, m.trace_header, 0, now(), now(), m.created_at,
               m.last_error_code, m.last_error
        FROM moved m
    ),
    audited AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic, tenant_id, dedupe_key,
                                     ordering_key, sequence_id, error_code, error_message, operator, reason)
        SELECT m.id, m.attempt_count, 'REPLAYED', m.namespace, m.topic, m.tenant_id, m.dedupe_key,
               m.ordering_key, m.sequence_id, m.last_error_code, m.last_error,
               coalesce(p_operator, session_user), p_reason
        FROM moved m
    )
    SELECT m.id FROM moved m ORDER BY m.failed_at, m.id;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.stats()
RETURNS TABLE(namespace text, topic text, pending bigint, due bigint, leased bigint,
              expired_leases bigint, oldest_pending_age_seconds double precision, dead bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH p AS (
        SELECT p.namespace, p.topic,
               count(*) AS pending,
               count(*) FILTER (WHERE p.lease_token IS NULL AND p.next_attempt_at <= now()) AS due,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL) AS leased,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL AND p.lease_expires_at <= now()) AS expired_leases,
               -- Age since the message became available, so that messages
               -- scheduled for later do not read as stuck.
               extract(epoch FROM now() - min(p.available_at) FILTER (WHERE p.available_at <= now()))::double precision AS oldest
        FROM outbox.pending p
        GROUP BY p.namespace, p.topic
    ),
    d AS (
        SELECT d.namespace, d.topic, count(*) AS dead
        FROM outbox.dead d
        GROUP BY d.namespace, d.topic
    )
    SELECT coalesce(p.namespace, d.namespace), coalesce(p.topic, d.topic),
           coalesce(p.pending, 0), coalesce(p.due, 0), coalesce(p.leased, 0),
           coalesce(p.expired_leases, 0), coalesce(greatest(p.oldest, 0), 0), coalesce(d.dead, 0)
    FROM p
    FULL JOIN d ON d.namespace = p.namespace AND d.topic = p.topic
    ORDER BY 1, 2
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.purge(
    p_attempts_older_than interval,
    p_dedupe_older_than   interval,
    p_max_rows            int)
RETURNS TABLE(purged_attempts bigint, purged_dedupe bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_attempts bigint := 0;
    v_dedupe   bigint := 0;
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    IF p_attempts_older_than < interval '0' OR p_dedupe_older_than < interval '0' THEN
        RAISE EXCEPTION 'outbox.purge: retention intervals must not be negative' USING ERRCODE = '22023';
    END IF;

    -- A NULL interval leaves that table alone. The history of a message
    -- that is still pending or dead is kept whatever its age: it is what an
    -- operator reads when deciding what to do with it.
    IF p_attempts_older_than IS NOT NULL THEN
        PERFORM set_config('outbox.purge_in_progress', 'on', true);
        DELETE FROM outbox.attempts a
        WHERE a.id IN (
            SELECT o.id FROM outbox.attempts o
            WHERE o.created_at < now() - p_attempts_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id)
            LIMIT p_max_rows);
        GET DIAGNOSTICS v_attempts = ROW_COUNT;
        PERFORM set_config('outbox.purge_in_progress', 'off', true);
    END IF;

    -- A dedupe key outlives its message only by the retention window; while
    -- the message is still pending or dead, its key stays.
    IF p_dedupe_older_than IS NOT NULL THEN
        DELETE FROM outbox.dedupe x
        USING (
            SELECT k.namespace, k.topic, k.dedupe_key FROM outbox.dedupe k
            WHERE k.created_at < now() - p_dedupe_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = k.message_id)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = k.message_id)
            LIMIT p_max_rows) doomed
        WHERE x.namespace = doomed.namespace AND x.topic = doomed.topic AND x.dedupe_key = doomed.dedupe_key;
        GET DIAGNOSTICS v_dedupe = ROW_COUNT;
    END IF;

    RETURN QUERY SELECT v_attempts, v_dedupe;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION outbox.purge(interval, interval, int);
DROP FUNCTION outbox.stats();
DROP FUNCTION outbox.replay_dead(uuid[], text, text, text, timestamptz, timestamptz, int, boolean, text, text);
DROP FUNCTION outbox.repair_expired_leases(int, text, int);
DROP FUNCTION outbox.complete(text, uuid, uuid, text, text, text, text, text, int, timestamptz, int);
DROP FUNCTION outbox.complete_batch(text, jsonb, int);
DROP FUNCTION outbox.claim_batch(int, text, int, text[]);
DROP FUNCTION outbox.enqueue_batch(text[], text[], text[], text[], text[], text[], text[], text[], timestamptz[]);
DROP FUNCTION outbox.enqueue(text, text, jsonb, text, text, text, jsonb, text, timestamptz);
