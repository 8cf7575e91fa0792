CREATE OR REPLACE FUNCTION outbox.complete_batch(
    p_worker_id      text,
    p_results        jsonb,
    p_max_attempts   int DEFAULT 100,
    p_omit_ok        boolean DEFAULT false,
    p_ids            uuid[] DEFAULT NULL,
    p_lease_tokens   uuid[] DEFAULT NULL,
    p_outcomes       text[] DEFAULT NULL,
    p_error_codes    text[] DEFAULT NULL,
    p_error_messages text[] DEFAULT NULL,
    p_targets        text[] DEFAULT NULL,
    p_target_refs    text[] DEFAULT NULL,
    p_latencies_ms   int[] DEFAULT NULL,
    p_retry_at       timestamptz[] DEFAULT NULL,
    p_on_dead        text[] DEFAULT NULL,
    p_hold           boolean[] DEFAULT NULL)
RETURNS TABLE(id uuid, status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- The statements' plans must not depend on the statistics of pending,
-- which are often wrong here: taken while nothing was leased, they say no
-- row is leased to any worker, so a planner trusting them drives a join
-- from pending and reads the whole batch again for each of its rows. Each
-- statement finds pending's rows by primary key from the batch's ids, and
-- joins them with the results by hash (nested loops and merge joins are
-- off while it runs). Such a plan is right for any batch and any queue, so
-- it is made once per session; and never a scan of a table where an index
-- will do, since it may be made while pending is nearly empty. A statement
-- that touches a batch of rows by index never repays a JIT compilation.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
-- The results come either as one JSON document, p_results:
--   [{"id", "lease_token", "outcome", "error_code", "error_message",
--     "target", "target_ref", "latency_ms", "retry_at", "on_dead", "hold"}, ...]
-- or, with p_results NULL, as arrays of one element per result (element i
-- of each describing result i): p_ids, p_lease_tokens and p_outcomes, and
-- any of the others (NULL, or a NULL element, where a result has none).
-- The two forms mean exactly the same; the arrays cost the database and
-- the caller far less for a large batch.
--
--   DISPATCHED  archived, the row leaves pending
--   RETRYABLE   archived, lease cleared, due again at retry_at; moved to
--               dead instead at the attempt ceiling
--   FAILED      archived, the row moves to outbox.dead
--   RELEASED    given back untouched: lease cleared, the claim's attempt
--               taken back, nothing archived (the rest of an ordered run
--               after a message that was not delivered); with a retry_at,
--               not due before it (a message held by its target's circuit
--               breaker or rate limit: outbox.gate_targets). A message of
--               a run behind its head is not written: it waits behind it.
--
-- hold (true) marks a RETRYABLE outcome of a configuration failure (access
-- denied, a missing target or route): it is retried without end, never
-- dead-lettered at the attempt ceiling, since the message is not at fault.
--
-- on_dead ("skip" or "park") is the route's policy for an ordered message
-- that dies here or later (see outbox.requeue_expired_leases): "park" makes
-- the dead message hold its key.
--
-- Status per result, in the results' order: ok; lease_lost (not leased to
-- this worker under this token any more, or expired: nothing written for
-- it); dead (RETRYABLE at the ceiling, moved to dead); double_dispatch
-- (DISPATCHED for a message already recorded as dispatched: it leaves
-- pending without a second DISPATCHED outcome, and the rest of the batch is
-- recorded as usual). With p_omit_ok the results recorded as ok are left
-- out, so that a batch that went well answers with no rows. The outcomes
-- are archived in the results' order too.
--
-- A malformed batch (a result without id, lease_token or a valid outcome
-- or on_dead, an id given twice) is refused whole with P7003: nothing of
-- it is written.
--
-- The fence (fragments/lease_fence.sql) is checked in each statement that
-- writes a row: only rows leased to this worker under the result's token,
-- unexpired, are written; the others are lease_lost. PostgreSQL evaluates
-- a statement's conditions with the snapshot it took when it began: when a
-- row is changed by another transaction meanwhile, it re-checks the row's
-- own columns after waiting for it, but not a run's head (another row) nor
-- the clock, and a row that was only locked by someone is not re-checked
-- at all. So after the statement, the completion checks that every lease
-- it wrote under was still live when the statement ended, and that every
-- message of a run whose head it did not write itself was fenced strictly.
-- If not (a lock waited on, a lease that ran out meanwhile, a partial run),
-- the statement is undone (a subtransaction) and run again strictly: the
-- rows and their runs' heads locked first, in id order, and the fence read
-- with a fresh snapshot, so that nothing can change them before they are
-- written. Takeovers never wait for a row a completion holds (they skip
-- it), so a completion and a takeover cannot deadlock.
#variable_conflict use_column
DECLARE
    v_now      timestamptz;
    v_try      int;
    v_strict   boolean := false;
    -- A second delivery of a message was refused in this call: the batch
    -- goes to the second statement, which archives ON CONFLICT.
    v_guarded  boolean := false;
    v_index    text;
    v_schema   text;
    -- What the post-check reads: the earliest expiry of the leases the
    -- statement wrote under, and messages of runs whose head it did not
    -- write (their keys).
    v_until    timestamptz;
    v_loose    int;
    -- Keys whose head stays pending (rescheduled or given back).
    v_stay_ns  text[];
    v_stay_ok  text[];
    v_nestloop text := current_setting('enable_nestloop');
    v_mergejoin text := current_setting('enable_mergejoin');
    v_recorded bigint;
    v_distinct int;
    v_invalid  int;
    -- The exceptions, in the results' order: ids, positions and statuses.
    v_ids      uuid[];
    v_ords     int[];
    v_statuses text[];
    v_all      text[];
    v_key_ns   text[];
    v_key_ok   text[];
    -- Runs whose head left pending with the run's lease (run_through
    -- set): the key, the head's sequence id, the run's extent and lease.
    v_run_ns      text[];
    v_run_ok      text[];
    v_run_seq     bigint[];
    v_run_through bigint[];
    v_run_token   uuid[];
    v_run_until   timestamptz[];
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_worker_id must not be empty' USING ERRCODE = 'P7003';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_max_attempts must be at least 1' USING ERRCODE = '22023';
    END IF;
    IF p_results IS NOT NULL THEN
        IF num_nonnulls(p_ids, p_lease_tokens, p_outcomes, p_error_codes, p_error_messages, p_targets,
                        p_target_refs, p_latencies_ms, p_retry_at, p_on_dead, p_hold) > 0 THEN
            RAISE EXCEPTION 'outbox.complete_batch: the results come either as p_results or as arrays (p_ids, ...), not both'
                USING ERRCODE = 'P7003';
        END IF;
        IF jsonb_typeof(p_results) IS DISTINCT FROM 'array' THEN
            RAISE EXCEPTION 'outbox.complete_batch: p_results must be a JSON array of results' USING ERRCODE = 'P7003';
        END IF;
        -- The document becomes the arrays. This block only reads, so its
        -- subtransaction never takes a transaction id.
        BEGIN
            SELECT array_agg(r.id ORDER BY r.ord), array_agg(r.lease_token ORDER BY r.ord),
                   array_agg(r.outcome ORDER BY r.ord), array_agg(r.error_code ORDER BY r.ord),
                   array_agg(r.error_message ORDER BY r.ord), array_agg(r.target ORDER BY r.ord),
                   array_agg(r.target_ref ORDER BY r.ord), array_agg(r.latency_ms ORDER BY r.ord),
                   array_agg(r.retry_at ORDER BY r.ord), array_agg(r.on_dead ORDER BY r.ord),
                   array_agg(r.hold ORDER BY r.ord)
              INTO p_ids, p_lease_tokens, p_outcomes, p_error_codes, p_error_messages, p_targets,
                   p_target_refs, p_latencies_ms, p_retry_at, p_on_dead, p_hold
              FROM ROWS FROM (jsonb_to_recordset(p_results) AS (
                       id uuid, lease_token uuid, outcome text, error_code text, error_message text,
                       target text, target_ref text, latency_ms int, retry_at timestamptz, on_dead text, hold boolean))
                   WITH ORDINALITY AS r(id, lease_token, outcome, error_code, error_message,
                                        target, target_ref, latency_ms, retry_at, on_dead, hold, ord);
        EXCEPTION WHEN invalid_text_representation OR invalid_parameter_value OR datatype_mismatch
                    OR invalid_datetime_format OR datetime_field_overflow OR numeric_value_out_of_range THEN
            RAISE EXCEPTION 'outbox.complete_batch: malformed result document: %', SQLERRM USING ERRCODE = 'P7003';
        END;
    ELSIF p_ids IS NULL THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_results must be a JSON array of results (or NULL, with the results as arrays in p_ids, ...)'
            USING ERRCODE = 'P7003';
    ELSIF p_lease_tokens IS NULL OR p_outcomes IS NULL
          OR cardinality(p_ids) <> ANY (ARRAY[cardinality(p_lease_tokens), cardinality(p_outcomes),
                                              cardinality(p_error_codes), cardinality(p_error_messages),
                                              cardinality(p_targets), cardinality(p_target_refs),
                                              cardinality(p_latencies_ms), cardinality(p_retry_at),
                                              cardinality(p_on_dead), cardinality(p_hold)]) THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_lease_tokens, p_outcomes and every other result array given must have one element per id (% ids)',
            cardinality(p_ids) USING ERRCODE = 'P7003';
    END IF;
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;

    -- Almost every batch is all DISPATCHED, and the outcomes of one claim:
    -- under one lease token. It runs the first statement, which fences
    -- every row with that token by primary key and matches the results'
    -- target fields to the rows it deleted only to archive them. Any other
    -- batch runs the second, which joins the results with their rows (a
    -- fifth more of the backend's CPU per message: docs/PERFORMANCE.md).
    -- In both, the exceptions (lease_lost, dead, double_dispatch) are
    -- looked for only when the counts of what was written say there are
    -- any.
    PERFORM set_config('enable_nestloop', 'off', true), set_config('enable_mergejoin', 'off', true);
    <<attempts>>
    FOR v_try IN 1 .. 4 LOOP
    BEGIN
        IF v_strict THEN
            -- The rows, and the heads of the runs of those that hold no
            -- lease of their own, in id order (see above).
            PERFORM 1 FROM outbox.pending x
            WHERE x.id = ANY (p_ids || ARRAY(
                      SELECT (SELECT h.id FROM outbox.pending h
                              WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key AND NOT h.behind)
                      FROM outbox.pending p
                      WHERE p.id = ANY (p_ids) AND p.lease_token IS NULL AND p.ordering_key IS NOT NULL))
            ORDER BY x.id
            FOR UPDATE OF x;
        END IF;
        v_now := clock_timestamp();

        -- (Arrays compare NULL elements as equal: results all without a
        -- token fence nothing here, and are refused below as they are
        -- elsewhere.)
        IF NOT v_guarded AND p_outcomes <@ ARRAY['DISPATCHED']
           AND p_lease_tokens = array_fill(p_lease_tokens[1], ARRAY[cardinality(p_lease_tokens)]) THEN
            WITH removed AS (
                DELETE FROM outbox.pending p
                USING (SELECT p_lease_tokens[1] AS lease_token) r
                WHERE p.id = ANY (p_ids)
                  AND ${lease_fence}
                RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                          p.attempt_count + (p.lease_token IS NULL)::int AS attempt_count,
                          p.run_through, p.lease_token, p.lease_expires_at
            ),
            -- The outcomes are archived in the results' order, whatever order
            -- the rows were found in: a run's messages in sequence order, as
            -- they were delivered. A plain INSERT: the double-delivery
            -- backstop (attempts_one_dispatched_per_message) refuses a
            -- second DISPATCHED for a message with a unique violation, which
            -- undoes this statement, and the batch is recorded again by the
            -- second one, whose ON CONFLICT archives the others and answers
            -- double_dispatch for that message only. ON CONFLICT here, on
            -- every delivery, cost the server about 1.5 µs a message
            -- (docs/PERFORMANCE.md) for what must never happen.
            archived AS (
                INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                             dedupe_key, ordering_key, sequence_id, target, target_ref,
                                             error_code, error_message, latency_ms)
                SELECT x.id, x.attempt_count, 'DISPATCHED', p_worker_id, x.namespace, x.topic, x.tenant_id,
                       x.dedupe_key, x.ordering_key, x.sequence_id, r.target, r.target_ref,
                       r.error_code, left(r.error_message, 4096), r.latency_ms
                FROM unnest(p_ids, p_error_codes, p_error_messages, p_targets, p_target_refs, p_latencies_ms)
                     WITH ORDINALITY AS r(id, error_code, error_message, target, target_ref, latency_ms, ord)
                JOIN removed x ON x.id = r.id
                ORDER BY r.ord
            ),
            tally AS (
                SELECT (SELECT count(*) FROM removed) AS removed
            ),
            exceptions AS (
                SELECT r.id, r.ord, 'lease_lost' AS status
                FROM unnest(p_ids) WITH ORDINALITY AS r(id, ord)
                WHERE (SELECT t.removed < cardinality(p_ids) FROM tally t)
                  AND r.id NOT IN (SELECT x.id FROM removed x)
            ),
            -- Per key: the last message of a run written here, and how far
            -- the runs of the heads written here reach.
            keys AS (
                SELECT x.namespace, x.ordering_key,
                       max(x.sequence_id) FILTER (WHERE x.lease_token IS NULL) AS last_behind,
                       max(x.run_through) AS through
                FROM removed x WHERE x.ordering_key IS NOT NULL
                GROUP BY x.namespace, x.ordering_key
            )
            SELECT t.removed, e.ids, e.ords, e.statuses, k.namespaces, k.keys,
                   k.run_ns, k.run_ok, k.run_seq, k.run_through, k.run_token, k.run_until,
                   (SELECT min(x.lease_expires_at) FROM removed x),
                   (SELECT count(*) FROM keys y WHERE y.last_behind > coalesce(y.through, 0))
              INTO v_recorded, v_ids, v_ords, v_statuses, v_key_ns, v_key_ok,
                   v_run_ns, v_run_ok, v_run_seq, v_run_through, v_run_token, v_run_until,
                   v_until, v_loose
              FROM tally t,
                   (SELECT array_agg(e.id ORDER BY e.ord) AS ids, array_agg(e.ord::int ORDER BY e.ord) AS ords,
                           array_agg(e.status ORDER BY e.ord) AS statuses
                    FROM exceptions e) e,
                   (SELECT array_agg(x.namespace) AS namespaces, array_agg(x.ordering_key) AS keys,
                           array_agg(x.namespace) FILTER (WHERE x.run_through > x.named_through) AS run_ns,
                           array_agg(x.ordering_key) FILTER (WHERE x.run_through > x.named_through) AS run_ok,
                           array_agg(x.sequence_id) FILTER (WHERE x.run_through > x.named_through) AS run_seq,
                           array_agg(x.run_through) FILTER (WHERE x.run_through > x.named_through) AS run_through,
                           array_agg(x.lease_token) FILTER (WHERE x.run_through > x.named_through) AS run_token,
                           array_agg(x.lease_expires_at) FILTER (WHERE x.run_through > x.named_through) AS run_until
                    FROM (SELECT x.*, max(x.sequence_id) OVER (PARTITION BY x.namespace, x.ordering_key) AS named_through
                          FROM removed x WHERE x.ordering_key IS NOT NULL) x) k;
        ELSE
            -- The statements of outcomes absent from the batch are skipped
            -- whole (a one-time filter on the outcomes).
            WITH
            -- The batch's rows as the statement's snapshot has them: the
            -- lease each was written under, for the check after it.
            held AS (
                SELECT p.id, p.namespace, p.ordering_key, p.sequence_id, p.lease_token, p.lease_expires_at, p.run_through
                FROM outbox.pending p
                WHERE p.id = ANY (p_ids)
            ),
            -- DISPATCHED and FAILED leave pending; so does a RETRYABLE outcome
            -- at the attempt ceiling, which becomes FAILED.
            removed AS (
                DELETE FROM outbox.pending p
                USING unnest(p_ids, p_lease_tokens, p_outcomes, p_error_codes, p_error_messages,
                             p_targets, p_target_refs, p_latencies_ms, p_on_dead, p_hold)
                      WITH ORDINALITY AS r(id, lease_token, outcome, error_code, error_message,
                                           target, target_ref, latency_ms, on_dead, hold, ord)
                WHERE p.id = ANY (p_ids)
                  AND p.id = r.id
                  AND ${lease_fence}
                  AND (r.outcome IN ('DISPATCHED', 'FAILED')
                       OR (r.outcome = 'RETRYABLE' AND p.attempt_count + (p.lease_token IS NULL)::int >= p_max_attempts
                           AND NOT coalesce(r.hold, false)))
                -- A delivered row's payload is not needed past this point:
                -- carrying it through the CTEs costs more than the delete itself.
                RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                          CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.payload END AS payload,
                          p.payload_bytes,
                          CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.headers END AS headers,
                          p.trace_header, p.attempt_count + (p.lease_token IS NULL)::int AS attempt_count,
                          p.available_at, p.created_at,
                          r.outcome AS requested,
                          CASE WHEN r.outcome = 'DISPATCHED' THEN 'DISPATCHED' ELSE 'FAILED' END AS outcome,
                          p.ordering_key IS NOT NULL AND r.outcome <> 'DISPATCHED'
                              AND coalesce(r.on_dead = 'park', p.park_on_dead) AS parks,
                          r.error_code, left(r.error_message, 4096) AS error_message, r.target, r.target_ref,
                          r.latency_ms, r.ord, p.run_through, p.lease_token, p.lease_expires_at
            ),
            rescheduled AS (
                UPDATE outbox.pending p
                SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL, run_through = NULL,
                    attempt_count = p.attempt_count + (p.lease_token IS NULL)::int,
                    next_attempt_at = greatest(coalesce(r.retry_at, v_now), v_now),
                    last_error_code = r.error_code,
                    last_error = left(r.error_message, 4096),
                    failing_since = coalesce(p.failing_since, v_now),
                    park_on_dead = coalesce(r.on_dead = 'park', p.park_on_dead)
                FROM unnest(p_ids, p_lease_tokens, p_outcomes, p_error_codes, p_error_messages,
                            p_targets, p_target_refs, p_latencies_ms, p_retry_at, p_on_dead, p_hold)
                     WITH ORDINALITY AS r(id, lease_token, outcome, error_code, error_message,
                                          target, target_ref, latency_ms, retry_at, on_dead, hold, ord)
                WHERE 'RETRYABLE' = ANY (p_outcomes)
                  AND p.id = ANY (p_ids)
                  AND p.id = r.id
                  AND ${lease_fence}
                  AND r.outcome = 'RETRYABLE'
                  AND (p.attempt_count + (p.lease_token IS NULL)::int < p_max_attempts OR coalesce(r.hold, false))
                RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                          p.attempt_count, r.error_code, left(r.error_message, 4096) AS error_message,
                          r.target, r.target_ref, r.latency_ms, r.ord
            ),
            released AS (
                UPDATE outbox.pending p
                SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL, run_through = NULL,
                    attempt_count = greatest(p.attempt_count - 1, 0),
                    -- Unchanged without a retry_at, so the update stays HOT.
                    next_attempt_at = greatest(p.next_attempt_at, coalesce(r.retry_at, p.next_attempt_at))
                FROM unnest(p_ids, p_lease_tokens, p_outcomes, p_retry_at) AS r(id, lease_token, outcome, retry_at)
                WHERE 'RELEASED' = ANY (p_outcomes)
                  AND p.id = ANY (p_ids)
                  AND p.id = r.id
                  AND p.lease_token IS NOT NULL
                  AND ${lease_fence}
                  AND r.outcome = 'RELEASED'
                RETURNING p.id
            ),
            -- A message of a run is given back by writing nothing: it holds no
            -- lease of its own, and its attempt was never charged. The run's
            -- lease ends with its head's (released or rescheduled above).
            released_behind AS (
                SELECT p.id
                FROM outbox.pending p
                JOIN unnest(p_ids, p_lease_tokens, p_outcomes) AS r(id, lease_token, outcome) ON p.id = r.id
                WHERE 'RELEASED' = ANY (p_outcomes)
                  AND p.id = ANY (p_ids)
                  AND r.outcome = 'RELEASED'
                  AND p.lease_token IS NULL
                  AND ${lease_fence}
            ),
            buried AS (
                INSERT INTO outbox.dead (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                         payload, payload_bytes, headers, trace_header, attempt_count, available_at,
                                         created_at, last_error_code, last_error, failed_by, holds_key)
                SELECT x.id, x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id,
                       x.payload, x.payload_bytes, x.headers, x.trace_header, x.attempt_count, x.available_at,
                       x.created_at, x.error_code, x.error_message, p_worker_id,
                       -- Only a key's first dead message holds it (a run stops at
                       -- its first failure, so there is no second; this keeps it so).
                       x.parks AND x.rank = 1
                           AND NOT EXISTS (SELECT 1 FROM outbox.dead d
                                           WHERE d.namespace = x.namespace AND d.ordering_key = x.ordering_key AND d.holds_key)
                FROM (SELECT y.*, row_number() OVER (PARTITION BY y.namespace, y.ordering_key, y.outcome ORDER BY y.sequence_id) AS rank
                      FROM removed y) x
                WHERE p_outcomes && ARRAY['FAILED', 'RETRYABLE'] AND x.outcome = 'FAILED'
            ),
            -- The double-delivery backstop, as above.
            archived AS (
                INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                             dedupe_key, ordering_key, sequence_id, target, target_ref,
                                             error_code, error_message, latency_ms)
                SELECT y.id, y.attempt_count, y.outcome, p_worker_id, y.namespace, y.topic, y.tenant_id,
                       y.dedupe_key, y.ordering_key, y.sequence_id, y.target, y.target_ref,
                       y.error_code, y.error_message, y.latency_ms
                FROM (SELECT x.id, x.attempt_count, x.outcome, x.namespace, x.topic, x.tenant_id, x.dedupe_key,
                             x.ordering_key, x.sequence_id, x.target, x.target_ref, x.error_code, x.error_message,
                             x.latency_ms, x.ord
                      FROM removed x
                      UNION ALL
                      SELECT q.id, q.attempt_count, 'RETRYABLE', q.namespace, q.topic, q.tenant_id, q.dedupe_key,
                             q.ordering_key, q.sequence_id, q.target, q.target_ref, q.error_code, q.error_message,
                             q.latency_ms, q.ord
                      FROM rescheduled q) y
                ORDER BY y.ord
                ON CONFLICT (message_id) WHERE state = 'DISPATCHED' DO NOTHING
                RETURNING message_id, state
            ),
            written AS (
                SELECT x.id FROM removed x UNION ALL SELECT q.id FROM rescheduled q
                UNION ALL SELECT l.id FROM released l UNION ALL SELECT b.id FROM released_behind b
            ),
            tally AS (
                SELECT (SELECT count(*) FROM removed) AS removed, (SELECT count(*) FROM rescheduled) AS rescheduled,
                       (SELECT count(*) FROM released) + (SELECT count(*) FROM released_behind) AS released,
                       (SELECT count(*) FROM archived) AS archived
            ),
            exceptions AS (
                SELECT r.id, r.ord, 'lease_lost' AS status
                FROM unnest(p_ids) WITH ORDINALITY AS r(id, ord)
                WHERE (SELECT t.removed + t.rescheduled + t.released < cardinality(p_ids) FROM tally t)
                  AND r.id NOT IN (SELECT w.id FROM written w)
                UNION ALL
                SELECT x.id, x.ord, 'dead'
                FROM removed x
                WHERE 'RETRYABLE' = ANY (p_outcomes) AND x.requested = 'RETRYABLE'
                UNION ALL
                -- Only a DISPATCHED outcome can fail to be archived.
                SELECT x.id, x.ord, 'double_dispatch'
                FROM removed x
                WHERE (SELECT t.archived < t.removed + t.rescheduled FROM tally t)
                  AND x.outcome = 'DISPATCHED'
                  AND x.id NOT IN (SELECT a.message_id FROM archived a WHERE a.state = 'DISPATCHED')
            ),
            -- What was written, with the lease each row held when the
            -- statement began (see held), for the check after it.
            leases AS (
                SELECT h.* FROM held h JOIN written w ON w.id = h.id
            ),
            keys AS (
                SELECT l.namespace, l.ordering_key,
                       max(l.sequence_id) FILTER (WHERE l.lease_token IS NULL) AS last_behind,
                       max(l.run_through) AS through
                FROM leases l WHERE l.ordering_key IS NOT NULL
                GROUP BY l.namespace, l.ordering_key
            )
            SELECT t.removed + t.rescheduled + t.released, e.ids, e.ords, e.statuses, k.namespaces, k.keys,
                   k.run_ns, k.run_ok, k.run_seq, k.run_through, k.run_token, k.run_until,
                   (SELECT min(l.lease_expires_at) FROM leases l),
                   (SELECT count(*) FROM keys y WHERE y.last_behind > coalesce(y.through, 0)),
                   -- Heads given back or rescheduled stay heads: settled too,
                   -- in case a message replayed behind them goes first.
                   (SELECT array_agg(l.namespace) FROM leases l
                    WHERE l.ordering_key IS NOT NULL AND l.lease_token IS NOT NULL
                      AND l.id NOT IN (SELECT x.id FROM removed x)),
                   (SELECT array_agg(l.ordering_key) FROM leases l
                    WHERE l.ordering_key IS NOT NULL AND l.lease_token IS NOT NULL
                      AND l.id NOT IN (SELECT x.id FROM removed x))
              INTO v_recorded, v_ids, v_ords, v_statuses, v_key_ns, v_key_ok,
                   v_run_ns, v_run_ok, v_run_seq, v_run_through, v_run_token, v_run_until,
                   v_until, v_loose, v_stay_ns, v_stay_ok
              FROM tally t,
                   (SELECT array_agg(e.id ORDER BY e.ord) AS ids, array_agg(e.ord::int ORDER BY e.ord) AS ords,
                           array_agg(e.status ORDER BY e.ord) AS statuses
                    FROM exceptions e) e,
                   (SELECT array_agg(x.namespace) AS namespaces, array_agg(x.ordering_key) AS keys,
                           array_agg(x.namespace) FILTER (WHERE x.run_through > x.named_through) AS run_ns,
                           array_agg(x.ordering_key) FILTER (WHERE x.run_through > x.named_through) AS run_ok,
                           array_agg(x.sequence_id) FILTER (WHERE x.run_through > x.named_through) AS run_seq,
                           array_agg(x.run_through) FILTER (WHERE x.run_through > x.named_through) AS run_through,
                           array_agg(x.lease_token) FILTER (WHERE x.run_through > x.named_through) AS run_token,
                           array_agg(x.lease_expires_at) FILTER (WHERE x.run_through > x.named_through) AS run_until
                    FROM (SELECT x.*, max(x.sequence_id) OVER (PARTITION BY x.namespace, x.ordering_key) AS named_through
                          FROM removed x WHERE x.ordering_key IS NOT NULL) x) k;
        END IF;

        -- The check after the statement (see above): every lease written
        -- under still live now, so live when each row was written; a run's
        -- message whose head this statement did not write was fenced
        -- strictly. Otherwise undo and fence strictly.
        IF NOT v_strict AND (v_until <= clock_timestamp() OR v_loose > 0) THEN
            RAISE EXCEPTION USING ERRCODE = 'P7090';
        END IF;
        IF v_strict AND v_until <= clock_timestamp() THEN
            RAISE EXCEPTION USING ERRCODE = 'P7090';
        END IF;
        EXIT attempts;
    EXCEPTION
        WHEN SQLSTATE 'P7090' THEN
            -- (Three tries, not counting the one a refused second delivery
            -- undid.)
            IF v_try = 3 + v_guarded::int THEN
                RAISE EXCEPTION 'outbox.complete_batch: the batch''s leases kept running out while it was recorded'
                    USING ERRCODE = 'P7002';
            END IF;
            v_strict := true;
        WHEN unique_violation THEN
            -- Only the first statement archives without ON CONFLICT, and
            -- only the backstop's index (a partition's copy of it) is a
            -- second delivery; anything else is not for this handler.
            GET STACKED DIAGNOSTICS v_index = CONSTRAINT_NAME, v_schema = SCHEMA_NAME;
            IF v_guarded OR NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_inherits i
                WHERE i.inhrelid = to_regclass(format('%I.%I', v_schema, v_index))
                  AND i.inhparent = 'outbox.attempts_one_dispatched_per_message'::regclass) THEN
                RAISE;
            END IF;
            v_guarded := true;
    END;
    END LOOP;

    PERFORM set_config('enable_nestloop', v_nestloop, true), set_config('enable_mergejoin', v_mergejoin, true);

    -- The batch is checked here, after the statement, from what it wrote: a
    -- result without id, token or a valid outcome matches no row, and a
    -- repeated id matches its row twice, which PostgreSQL changes once; so
    -- when every result was recorded, none of them is malformed, and the
    -- results are read again only when some were not. The RAISE aborts the
    -- call, and with it everything the statement wrote, so a malformed
    -- batch never half-applies.
    IF v_recorded < cardinality(p_ids)
       OR NOT coalesce(array_remove(p_on_dead, NULL) <@ ARRAY['skip', 'park'], true) THEN
        SELECT count(*) FILTER (WHERE x.id IS NULL OR x.lease_token IS NULL OR x.outcome IS NULL
                                   OR x.outcome NOT IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'RELEASED')
                                   OR (x.on_dead IS NOT NULL AND x.on_dead NOT IN ('skip', 'park'))),
               count(DISTINCT x.id)
          INTO v_invalid, v_distinct
          FROM unnest(p_ids, p_lease_tokens, p_outcomes, p_on_dead) AS x(id, lease_token, outcome, on_dead);
        IF v_invalid > 0 THEN
            RAISE EXCEPTION 'outbox.complete_batch: % result(s) without id, lease_token or a valid outcome (DISPATCHED, RETRYABLE, FAILED, RELEASED) and on_dead (skip, park)', v_invalid
                USING ERRCODE = 'P7003';
        END IF;
        IF v_distinct <> cardinality(p_ids) THEN
            RAISE EXCEPTION 'outbox.complete_batch: a message id appears more than once in one batch' USING ERRCODE = 'P7003';
        END IF;
    END IF;

    -- A run whose head left pending while messages of the run were not
    -- named in this call (a caller recording outcomes one message at a
    -- time, in order) keeps its lease: the first of them takes it over,
    -- its attempt charged now, so that no other claim can take the key
    -- while this one may still be delivering them. Only runs whose last
    -- message did not leave in this call are looked at (v_run_*): the
    -- dispatcher records a run whole, and a probe of a key whose messages
    -- were just deleted steps over each of them.
    IF v_run_ns IS NOT NULL THEN
        WITH heirs AS (
            SELECT n.id, x.through, x.token, x.until
            FROM unnest(v_run_ns, v_run_ok, v_run_seq, v_run_through, v_run_token, v_run_until)
                 AS x(ns, ok, seq, through, token, until)
            CROSS JOIN LATERAL (
                SELECT q.id FROM outbox.pending q
                WHERE q.namespace = x.ns AND q.ordering_key = x.ok
                  AND q.sequence_id > x.seq AND q.sequence_id <= x.through
                ORDER BY q.sequence_id
                LIMIT 1) n
            WHERE n.id <> ALL (p_ids)
        )
        -- The heir is the key's head now (its head just left), as the
        -- completion's fence finds a run's head.
        UPDATE outbox.pending p
        SET claimed_by = p_worker_id, lease_token = h.token, lease_expires_at = h.until,
            attempt_count = p.attempt_count + 1,
            run_through = CASE WHEN h.through > p.sequence_id THEN h.through END,
            behind = EXISTS (SELECT 1 FROM outbox.pending o
                             WHERE o.namespace = p.namespace AND o.ordering_key = p.ordering_key
                               AND NOT o.behind AND o.id <> p.id)
        FROM heirs h
        WHERE p.id = h.id AND p.lease_token IS NULL;
    END IF;

    -- A key whose message left pending has a new head (or is parked), and
    -- one whose head was rescheduled or given back may have a replayed
    -- message to put first; a key a producer is committing to right now is
    -- left to the next claim.
    v_key_ns := v_key_ns || v_stay_ns;
    v_key_ok := v_key_ok || v_stay_ok;
    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, false);
    END IF;

    IF p_omit_ok THEN
        RETURN QUERY SELECT u.id, u.status FROM unnest(v_ids, v_statuses) AS u(id, status);
    ELSE
        v_all := array_fill('ok'::text, ARRAY[cardinality(p_ids)]);
        FOR i IN 1 .. coalesce(cardinality(v_ords), 0) LOOP
            v_all[v_ords[i]] := v_statuses[i];
        END LOOP;
        RETURN QUERY SELECT u.id, u.status FROM unnest(p_ids, v_all) AS u(id, status);
    END IF;
END;
$$;
REVOKE ALL ON FUNCTION outbox.complete_batch(p_worker_id text, p_results jsonb, p_max_attempts integer, p_omit_ok boolean, p_ids uuid[], p_lease_tokens uuid[], p_outcomes text[], p_error_codes text[], p_error_messages text[], p_targets text[], p_target_refs text[], p_latencies_ms integer[], p_retry_at timestamp with time zone[], p_on_dead text[], p_hold boolean[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.complete_batch(p_worker_id text, p_results jsonb, p_max_attempts integer, p_omit_ok boolean, p_ids uuid[], p_lease_tokens uuid[], p_outcomes text[], p_error_codes text[], p_error_messages text[], p_targets text[], p_target_refs text[], p_latencies_ms integer[], p_retry_at timestamp with time zone[], p_on_dead text[], p_hold boolean[]) TO outbox_dispatcher;
