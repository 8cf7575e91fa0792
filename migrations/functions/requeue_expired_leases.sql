-- requeue_expired_leases takes over leases that expired by p_now, oldest
-- first: p_limit rows of the namespaces p_namespaces (NULL: all), and the
-- rest of any ordered run the limit cut, since a run is taken over whole.
-- Each row is due at p_now again with its lease cleared (a head stays its
-- key's head), and a ZOMBIE_REQUEUE naming the lease's holder is archived
-- under p_worker_id; at the attempt ceiling p_max_attempts the row is
-- dead-lettered as LEASE_EXPIRED instead, parking its key if the route said
-- so when it last reported on the message. Returns the rows it took over.
-- The one place a lease is taken over: the reaper (repair_expired_leases)
-- and every claim (claim_batch) call it. Not executable by any runtime
-- role; they call it as its owner.
--
-- One taker per key. An ordered run is taken over by whoever first locks
-- its key's row in outbox.keys (SKIP LOCKED: a key another taker holds is
-- left to it), so that two takers never split a run between them; a split
-- would let a claim lease the key's head anew while the rest of the run
-- still holds the old lease. A claim leases all its rows under one token
-- and one expiry, and nothing moves an expiry afterwards, so a lease's rows
-- are found in pending_lease_expiry by the two, whatever the key's backlog.
CREATE OR REPLACE FUNCTION outbox.requeue_expired_leases(
    p_limit        int,
    p_worker_id    text,
    p_max_attempts int,
    p_now          timestamptz,
    p_namespaces   text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- Expired leases and their runs, by index, whatever the statistics say:
-- see outbox.claim_batch.
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_loose    uuid[];
    v_ns       text[];
    v_ok       text[];
    v_tokens   uuid[];
    v_expiry   timestamptz[];
    v_owned    text[];
    v_ids      uuid[];
    v_heads    uuid[];
    v_members  uuid[];
    v_behind   uuid[];
    v_held     uuid[];
    v_repaired integer;
    v_key_ns   text[];
    v_key_ok   text[];
BEGIN
    -- 1. The oldest expired leases, read without locking: a row another
    --    taker holds is skipped below, and so is a key.
    SELECT array_agg(c.id) FILTER (WHERE c.ordering_key IS NULL),
           array_agg(c.namespace) FILTER (WHERE c.ordering_key IS NOT NULL),
           array_agg(c.ordering_key) FILTER (WHERE c.ordering_key IS NOT NULL),
           array_agg(c.lease_token) FILTER (WHERE c.ordering_key IS NOT NULL),
           array_agg(c.lease_expires_at) FILTER (WHERE c.ordering_key IS NOT NULL)
      INTO v_loose, v_ns, v_ok, v_tokens, v_expiry
      FROM (SELECT p.id, p.namespace, p.ordering_key, p.lease_token, p.lease_expires_at
            FROM outbox.pending p
            WHERE p.lease_token IS NOT NULL AND p.attempt_count >= 0 AND p.lease_expires_at <= p_now
              AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
            ORDER BY p.lease_expires_at
            LIMIT p_limit) c;

    -- 2. Unordered rows, locked one by one; ordered runs, each whole under
    --    its key's lock (see above). Nothing here waits: a row someone holds
    --    (a completion recording it, an operator) is skipped, and so is a
    --    run any of whose messages someone holds, so that a takeover never
    --    waits for a completion that may be waiting for it.
    v_ids := ARRAY(
        SELECT p.id FROM outbox.pending p
        WHERE p.id = ANY (v_loose) AND p.lease_token IS NOT NULL AND p.lease_expires_at <= p_now
        FOR UPDATE OF p SKIP LOCKED);
    IF v_ns IS NOT NULL THEN
        -- A key as one text, for the hashed = ANY below: its namespace's
        -- length first, so that no two keys read the same.
        v_owned := ARRAY(
            SELECT octet_length(k.namespace) || ':' || k.namespace || k.ordering_key
            FROM outbox.keys k
            WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(v_ns, v_ok))
            ORDER BY k.namespace, k.ordering_key
            FOR UPDATE SKIP LOCKED);
        -- Each lease read once, by its expiry, for the runs of the keys
        -- taken.
        v_heads := ARRAY(
            SELECT q.id FROM outbox.pending q
            WHERE q.lease_token IS NOT NULL AND q.attempt_count >= 0 AND q.lease_expires_at = ANY (v_expiry)
              AND q.lease_token = ANY (v_tokens)
              AND octet_length(q.namespace) || ':' || q.namespace || q.ordering_key = ANY (v_owned)
            FOR UPDATE OF q SKIP LOCKED);
        -- The messages of their runs, locked without waiting; a run one of
        -- whose messages someone holds is left for a later pass.
        v_members := ARRAY(
            SELECT f.id FROM outbox.pending h
            CROSS JOIN LATERAL (SELECT f.id FROM outbox.pending f
                                WHERE f.namespace = h.namespace AND f.ordering_key = h.ordering_key
                                  AND f.sequence_id > h.sequence_id AND f.sequence_id <= h.run_through) f
            WHERE h.id = ANY (v_heads) AND h.run_through IS NOT NULL);
        v_behind := ARRAY(SELECT f.id FROM outbox.pending f WHERE f.id = ANY (v_members) FOR UPDATE OF f SKIP LOCKED);
        IF cardinality(v_behind) < cardinality(v_members) THEN
            v_held := ARRAY(
                SELECT DISTINCT h.id FROM outbox.pending h
                CROSS JOIN LATERAL (SELECT f.id FROM outbox.pending f
                                    WHERE f.namespace = h.namespace AND f.ordering_key = h.ordering_key
                                      AND f.sequence_id > h.sequence_id AND f.sequence_id <= h.run_through) f
                WHERE h.id = ANY (v_heads) AND h.run_through IS NOT NULL AND f.id <> ALL (v_behind));
        END IF;
        v_ids := v_ids || ARRAY(SELECT x FROM unnest(v_heads) x WHERE x <> ALL (coalesce(v_held, '{}')));
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;

    -- 3. Requeued, or dead at the ceiling; archived either way.
    WITH expired AS (
        SELECT p.id, p.claimed_by AS held_by, p.namespace, p.ordering_key, p.sequence_id, p.run_through
        FROM outbox.pending p
        WHERE p.id = ANY (v_ids) AND p.lease_token IS NOT NULL AND p.lease_expires_at <= p_now
    ),
    requeued AS (
        UPDATE outbox.pending p
        SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL, run_through = NULL,
            next_attempt_at = p_now,
            last_error_code = 'LEASE_EXPIRED',
            last_error = 'lease held by ' || e.held_by || ' expired before completion'
        FROM expired e
        WHERE p.id = e.id AND p.attempt_count < p_max_attempts
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  p.attempt_count, e.held_by
    ),
    -- The messages of an expired head's run (leased with it, see
    -- claim_batch) are requeued with it: their attempt, in flight when the
    -- lease ran out, is charged and archived as the head's is.
    run_rows AS (
        UPDATE outbox.pending f
        SET attempt_count = f.attempt_count + 1,
            last_error_code = 'LEASE_EXPIRED',
            last_error = 'lease held by ' || e.held_by || ' expired before completion'
        FROM expired e
        WHERE e.run_through IS NOT NULL
          AND f.id = ANY (v_behind)
          AND f.namespace = e.namespace AND f.ordering_key = e.ordering_key
          AND f.sequence_id > e.sequence_id AND f.sequence_id <= e.run_through
          AND f.lease_token IS NULL
        RETURNING f.id, f.namespace, f.topic, f.tenant_id, f.dedupe_key, f.ordering_key, f.sequence_id,
                  f.attempt_count, e.held_by
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
                                 payload, payload_bytes, headers, trace_header, attempt_count, available_at,
                                 created_at, last_error_code, last_error, failed_by, holds_key)
        SELECT x.id, x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id,
               x.payload, x.payload_bytes, x.headers, x.trace_header, x.attempt_count, x.available_at,
               x.created_at, 'LEASE_EXPIRED',
               'lease held by ' || x.held_by || ' expired on attempt ' || x.attempt_count
                   || ', the attempt ceiling; moved to dead',
               p_worker_id,
               -- The key's first message to die here holds it, if the
               -- route parks (one claim per key: there is no other).
               x.ordering_key IS NOT NULL AND x.park_on_dead AND x.rank = 1
                   AND NOT EXISTS (SELECT 1 FROM outbox.dead d
                                   WHERE d.namespace = x.namespace AND d.ordering_key = x.ordering_key AND d.holds_key)
        FROM (SELECT y.*, row_number() OVER (PARTITION BY y.namespace, y.ordering_key ORDER BY y.sequence_id) AS rank
              FROM removed y) x
    ),
    archived AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                     dedupe_key, ordering_key, sequence_id, error_code, error_message)
        SELECT q.id, q.attempt_count, 'ZOMBIE_REQUEUE', p_worker_id, q.namespace, q.topic, q.tenant_id,
               q.dedupe_key, q.ordering_key, q.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || q.held_by || ' expired before completion'
        FROM requeued q
        UNION ALL
        SELECT q.id, q.attempt_count, 'ZOMBIE_REQUEUE', p_worker_id, q.namespace, q.topic, q.tenant_id,
               q.dedupe_key, q.ordering_key, q.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || q.held_by || ' expired before completion'
        FROM run_rows q
        UNION ALL
        SELECT x.id, x.attempt_count, 'FAILED', p_worker_id, x.namespace, x.topic, x.tenant_id,
               x.dedupe_key, x.ordering_key, x.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || x.held_by || ' expired on attempt ' || x.attempt_count
                   || ', the attempt ceiling; moved to dead'
        FROM removed x
    )
    SELECT (SELECT count(*) FROM requeued) + (SELECT count(*) FROM run_rows) + (SELECT count(*) FROM removed),
           (SELECT array_agg(x.namespace) FROM (SELECT y.namespace, y.ordering_key FROM removed y
                                                UNION ALL SELECT q.namespace, q.ordering_key FROM requeued q) x
            WHERE x.ordering_key IS NOT NULL),
           (SELECT array_agg(x.ordering_key) FROM (SELECT y.namespace, y.ordering_key FROM removed y
                                                   UNION ALL SELECT q.namespace, q.ordering_key FROM requeued q) x
            WHERE x.ordering_key IS NOT NULL)
      INTO v_repaired, v_key_ns, v_key_ok;

    -- A key whose message died here has a new head, or is parked, and one
    -- whose head was requeued may have a replayed message to put first (its
    -- lock is already this transaction's).
    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, false);
    END IF;
    RETURN v_repaired;
END;
$$;
REVOKE ALL ON FUNCTION outbox.requeue_expired_leases(p_limit integer, p_worker_id text, p_max_attempts integer, p_now timestamp with time zone, p_namespaces text[]) FROM PUBLIC;
