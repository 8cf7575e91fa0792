-- A run's lease is its head's: claiming 25 messages of one key writes one row.
--
-- Until now a claim leased every message it took, the messages of ordered
-- runs too: each leased row was written anew with its index entries
-- (claimable, lease expiry, the key's sequence), so a claim of 40 runs of 25
-- cost more than twice an unordered claim of 1,000 (44 ms against 23 ms
-- measured in one database; the key's sequence index alone 5 ms). Now the
-- head of a run is leased and records the run's last sequence id in
-- pending.run_through; the messages behind it are read, not written. The
-- run's lease is the head's: its token, holder and expiry fence every
-- message of the run (see complete_batch), the reaper requeues the head and
-- with it the run, and each message's attempt is charged when its outcome
-- is recorded rather than when it is claimed.
--
-- claim_batch returns the same rows as before, the run's messages with the
-- head's token and expiry and their attempt count as charged. complete_batch
-- accepts the same results: a run's message is fenced by its head's lease;
-- a run whose head left pending while later messages of the run were not
-- named in the call passes its lease on to the first of them. discard,
-- stats and pending_messages count a run's messages as leased with their
-- head. Leases held when this migration runs are converted in place.

-- +goose Up
SET LOCAL ROLE outbox_owner;

ALTER TABLE outbox.pending
    ADD COLUMN run_through bigint,
    ADD CONSTRAINT pending_run_through_is_a_leased_run
        CHECK (run_through IS NULL OR (lease_token IS NOT NULL AND run_through > sequence_id));
COMMENT ON COLUMN outbox.pending.run_through IS
    'On a leased ordered head: the last sequence_id of the run leased with it. The messages of the key after the head up to it are leased with the head (its token, holder and expiry) without a lease of their own.';

-- Runs leased when this runs: the first message of each (key, token) keeps
-- the lease for the run; the others give theirs up, and their attempt back
-- (it is charged when their outcome is recorded).
WITH runs AS (
    SELECT p.namespace, p.ordering_key, p.lease_token, min(p.sequence_id) AS first, max(p.sequence_id) AS last
    FROM outbox.pending p
    WHERE p.ordering_key IS NOT NULL AND p.lease_token IS NOT NULL
    GROUP BY p.namespace, p.ordering_key, p.lease_token
    HAVING count(*) > 1
),
heads AS (
    UPDATE outbox.pending h SET run_through = r.last
    FROM runs r
    WHERE h.namespace = r.namespace AND h.ordering_key = r.ordering_key AND h.lease_token = r.lease_token
      AND h.sequence_id = r.first
    RETURNING h.id
)
UPDATE outbox.pending f
SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL, attempt_count = greatest(f.attempt_count - 1, 0)
FROM runs r
WHERE f.namespace = r.namespace AND f.ordering_key = r.ordering_key AND f.lease_token = r.lease_token
  AND f.sequence_id > r.first;


-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.claim_batch(
    p_batch_size        int,
    p_worker_id         text,
    p_lease_seconds     int,
    p_namespaces        text[] DEFAULT NULL,
    p_max_run           int DEFAULT 1,
    p_max_bytes         bigint DEFAULT NULL,
    p_max_payload_bytes int DEFAULT NULL,
    p_max_attempts      int DEFAULT 100)
RETURNS TABLE(id uuid, namespace text, topic text, tenant_id text, dedupe_key text,
              ordering_key text, sequence_id bigint, payload jsonb, headers jsonb,
              trace_header text, attempt_count int, lease_token uuid,
              lease_expires_at timestamptz, created_at timestamptz, payload_bytes int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- One plan per statement and session: planning afresh on every call cost a
-- hot key's claim of 100 more than running it (2.0 ms against 1.5 ms with
-- the plan cached). A generic plan cannot see the LIMIT, and would walk the
-- queue and sort it; with sequential scans and sorts refused below, every
-- statement is planned as the walk of its index that it must be (the claim
-- index in (next_attempt_at, id) order, a key's run in sequence order, the
-- lease by primary key), whatever the statistics said when it was planned.
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
-- Every statement here reads at most p_batch_size heads and their runs by
-- index, which a JIT compilation (tens of milliseconds, not cached between
-- calls) never repays. The planner cannot know that: it estimates the runs
-- behind the heads from the table's statistics, and one long key (a stuck
-- head with its backlog) lifts the estimate past jit_above_cost.
SET jit = off
-- Its statements find rows by index (the claim index, a key's run, the
-- lease by primary key); statistics taken while pending was nearly empty
-- made the lease's UPDATE ... WHERE id = ANY scan the whole queue.
SET enable_seqscan = off
AS $$
-- Claims up to p_batch_size messages: due heads and unordered messages in
-- (next_attempt_at, id) order, each ordered head followed by up to
-- p_max_run - 1 of the messages queued behind it (its run, in sequence
-- order, stopping at the first that is not due, leased or paused: a key's
-- messages may span topics, and one topic be paused), all under one lease
-- token.
--
-- A run's lease is its head's. The head row is leased (claimed_by,
-- lease_token, lease_expires_at, its attempt charged) and records the last
-- sequence id of its run in run_through; the messages behind it are read,
-- not written: they are returned with the head's token and expiry and
-- their attempt count as it will be once charged, and their attempt is
-- charged when their outcome is recorded (outbox.complete_batch). Leasing
-- a row writes a new version of it and of its index entries; a run of 25
-- written as one row instead of 25 is what makes a claim of ordered keys
-- cost less than an unordered one of the same size (see migration 9). The claim stops before its payloads would exceed
-- p_max_bytes (it always takes at least one message). A message whose
-- payload is larger than p_max_payload_bytes (the most any route may send)
-- is claimed without its payload (NULL) and does not count against
-- p_max_bytes: the dispatcher dead-letters it without loading it.
--
-- Takeover. Leases of p_namespaces that expired (a dispatcher crashed or
-- overran) are taken over first, up to p_batch_size rows and the rest of
-- any ordered run the limit cut (a run goes whole), exactly as the reaper
-- does (outbox.requeue_expired_leases, with p_max_attempts the attempt
-- ceiling): a ZOMBIE_REQUEUE each, naming the holder, or a LEASE_EXPIRED
-- dead letter at the ceiling. They are due now, so this claim may take
-- them back at once. Without an expired lease this costs one probe of
-- pending_lease_expiry.
--
-- Cost. Two ways to the same claim, chosen by the first claimable head
-- (one probe of pending_claimable and one of pending_key_sequence):
--  * It is an ordered head with messages behind it (a queue of ordered
--    keys): the heads are read and locked one by one, each followed at once
--    by its run, until the batch is full. 40 keys of 25 fill a batch of
--    1000: 40 heads are locked and leased, not 1000, and nothing is read
--    twice.
--  * Otherwise (unordered messages, or keys of one message each): the
--    heads are locked as an unordered claim locks its rows, up to
--    p_batch_size of them; the runs of any ordered heads among them are then
--    read and locked only as far as the batch takes them.
-- Either way a head locked but not taken is left as it was (a concurrent
-- claim skips it until this one commits). The messages behind a head are
-- not locked: the head's lock keeps every other claim off its key, and an
-- operator's discard takes the head's lock before it looks at them.
#variable_conflict use_column
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_token   uuid := gen_random_uuid();
    v_ids     uuid[];
    v_ordered boolean;
    v_runs    boolean := false;
    v_heads   uuid[];
    v_ns      text[];
    v_keys    text[];
    v_seqs    bigint[];
    v_bytes   int[];
    -- The claim: the leased rows (heads, unordered messages) with each one's
    -- run_through (NULL without a run), and the messages of the runs.
    v_holders uuid[];
    v_through bigint[];
    v_behind  uuid[];
    -- Whether anything is paused: without a pause (almost always), the
    -- heads' pause filter below is never evaluated.
    v_paused  boolean := EXISTS (SELECT 1 FROM outbox.paused);
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
    IF p_max_run IS NULL OR p_max_run < 1 OR p_max_run > 10000 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_max_run must be between 1 and 10000, got %', p_max_run
            USING ERRCODE = '22023';
    END IF;
    IF p_max_bytes < 1 OR p_max_payload_bytes < 1 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_max_bytes and p_max_payload_bytes must be positive (or NULL), got % and %',
            p_max_bytes, p_max_payload_bytes USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_max_attempts must be at least 1, got %', p_max_attempts
            USING ERRCODE = '22023';
    END IF;

    -- Expired leases, taken over (see "Takeover" above). Almost never any.
    IF EXISTS (SELECT 1 FROM outbox.pending p
               WHERE p.lease_token IS NOT NULL AND p.attempt_count >= 0 AND p.lease_expires_at <= v_now
                 AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))) THEN
        PERFORM outbox.requeue_expired_leases(p_batch_size, p_worker_id, p_max_attempts, v_now, p_namespaces);
    END IF;

    -- Keys a dispatcher could not settle without waiting: settle them now,
    -- so that their heads are claimable. Almost always empty.
    IF EXISTS (SELECT 1 FROM outbox.unsettled_keys) THEN
        PERFORM outbox.settle_unsettled(100);
    END IF;

    -- Which way (see "Cost" above): does the first claimable head have a
    -- run behind it? Read without a lock; either way is correct whatever
    -- the answer, only the cost differs.
    IF p_max_run > 1 THEN
        SELECT EXISTS (SELECT 1 FROM outbox.pending q
                       WHERE q.namespace = p.namespace AND q.ordering_key = p.ordering_key
                         AND q.sequence_id > p.sequence_id)
          INTO v_runs
          FROM outbox.pending p
          WHERE p.lease_token IS NULL
            AND NOT p.behind
            AND NOT p.paused
            AND p.next_attempt_at <= v_now
            AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
          ORDER BY p.next_attempt_at, p.id
          LIMIT 1;
        v_runs := coalesce(v_runs, false);
    END IF;

    IF v_runs THEN
        -- The heads in order, each locked and followed by its run as the
        -- batch reaches it: the LIMIT of the runs stops the scan of the
        -- heads, so the heads behind the batch's last run are neither read
        -- nor locked. The runs are read, locked and cut exactly as in step 3
        -- below.
        WITH heads AS (
            SELECT p.id, p.namespace, p.ordering_key, p.sequence_id, p.payload_bytes, p.next_attempt_at
            FROM outbox.pending p
            WHERE p.lease_token IS NULL
              AND NOT p.behind
              AND NOT p.paused
              AND p.next_attempt_at <= v_now
              AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
              AND (NOT v_paused OR NOT EXISTS (SELECT 1 FROM outbox.paused z
                                               WHERE z.namespace = p.namespace AND z.topic IN (p.topic, '*')))
            ORDER BY p.next_attempt_at, p.id
            LIMIT p_batch_size
            FOR UPDATE OF p SKIP LOCKED
        ),
        expanded AS MATERIALIZED (
            SELECT h.next_attempt_at AS due, h.id AS head, r.k, r.id, r.sequence_id, r.payload_bytes
            FROM heads h
            CROSS JOIN LATERAL (
                SELECT h.id, 0::bigint AS k, h.sequence_id, h.payload_bytes
                UNION ALL
                SELECT f.id, f.k, f.sequence_id, f.payload_bytes
                FROM (
                    SELECT q.id, q.sequence_id, q.payload_bytes,
                           row_number() OVER w AS k,
                           count(*) FILTER (WHERE q.lease_token IS NOT NULL OR q.next_attempt_at > v_now OR q.paused) OVER w AS misses
                    FROM (SELECT q.id, q.sequence_id, q.payload_bytes, q.lease_token, q.next_attempt_at, q.paused
                          FROM outbox.pending q
                          WHERE h.ordering_key IS NOT NULL
                            AND q.namespace = h.namespace AND q.ordering_key = h.ordering_key
                            AND q.sequence_id > h.sequence_id
                          ORDER BY q.sequence_id
                          LIMIT p_max_run - 1) q
                    WINDOW w AS (ORDER BY q.sequence_id ROWS UNBOUNDED PRECEDING)
                ) f
                WHERE f.misses = 0
            ) r
            LIMIT p_batch_size
        ),
        ranked AS (
            SELECT e.head, e.k, e.id, e.sequence_id, row_number() OVER w AS n,
                   sum(CASE WHEN e.payload_bytes > p_max_payload_bytes THEN 0 ELSE e.payload_bytes END) OVER w AS bytes
            FROM expanded e
            WINDOW w AS (ORDER BY e.due, e.head, e.k)
        ),
        taken AS (
            SELECT r.k, r.id, max(r.sequence_id) FILTER (WHERE r.k > 0) OVER (PARTITION BY r.head) AS through
            FROM ranked r
            WHERE r.n <= p_batch_size AND (r.n = 1 OR p_max_bytes IS NULL OR r.bytes <= p_max_bytes)
        )
        SELECT array_agg(t.id) FILTER (WHERE t.k = 0), array_agg(t.through) FILTER (WHERE t.k = 0),
               array_agg(t.id) FILTER (WHERE t.k > 0)
          INTO v_holders, v_through, v_behind
          FROM taken t;
    END IF;

    IF NOT v_runs THEN
        -- 1. The heads, locked until commit. Without an ordered head among
        --    them (or with runs of one) they are the claim, up to the byte
        --    budget; the arrays describe them, aligned, for the steps below.
        WITH heads AS (
            SELECT p.id, p.namespace, p.ordering_key, p.sequence_id, p.payload_bytes, p.next_attempt_at
            FROM outbox.pending p
            WHERE p.lease_token IS NULL
              AND NOT p.behind
              AND NOT p.paused
              AND p.next_attempt_at <= v_now
              AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
              -- A message committed while its namespace or topic was being
              -- paused can miss the pause's mark (see outbox.pause): it is
              -- skipped here until the next pause or resume marks it.
              AND (NOT v_paused OR NOT EXISTS (SELECT 1 FROM outbox.paused z
                                               WHERE z.namespace = p.namespace AND z.topic IN (p.topic, '*')))
            ORDER BY p.next_attempt_at, p.id
            LIMIT p_batch_size
            FOR UPDATE OF p SKIP LOCKED
        ),
        ranked AS (
            SELECT h.id, h.namespace, h.ordering_key, h.sequence_id, h.payload_bytes,
                   row_number() OVER w AS n,
                   sum(CASE WHEN h.payload_bytes > p_max_payload_bytes THEN 0 ELSE h.payload_bytes END) OVER w AS bytes
            FROM heads h
            WINDOW w AS (ORDER BY h.next_attempt_at, h.id)
        )
        SELECT array_agg(r.id) FILTER (WHERE r.n = 1 OR p_max_bytes IS NULL OR r.bytes <= p_max_bytes),
               coalesce(bool_or(r.ordering_key IS NOT NULL), false) AND p_max_run > 1,
               array_agg(r.id), array_agg(r.namespace), array_agg(r.ordering_key),
               array_agg(r.sequence_id), array_agg(r.payload_bytes)
          INTO v_ids, v_ordered, v_heads, v_ns, v_keys, v_seqs, v_bytes
          FROM ranked r;

        -- 2. Per-entity keys, one message each, have nothing behind their
        --    heads: then the heads are the claim all the same. One probe of
        --    pending_key_sequence per ordered head (an index-only scan) finds
        --    out, and the first head with a message behind it ends the search.
        IF v_ordered THEN
            v_ordered := EXISTS (
                SELECT 1 FROM unnest(v_ns, v_keys, v_seqs) AS h(namespace, ordering_key, sequence_id)
                WHERE h.ordering_key IS NOT NULL
                  AND EXISTS (SELECT 1 FROM outbox.pending q
                              WHERE q.namespace = h.namespace AND q.ordering_key = h.ordering_key
                                AND q.sequence_id > h.sequence_id));
        END IF;

        -- 3. The runs. The heads in order, each followed by its run, under a
        --    LIMIT of the batch: the nested loop expands a head only when the
        --    rows before it did not fill the batch, so the keys behind the
        --    batch's last run cost nothing. A run reads its followers in
        --    sequence order and stops at the first that is not due, leased or
        --    paused: the window's run condition ends the scan there. A key's
        --    share of the claim is always a prefix of its run.
        IF v_ordered THEN
            WITH expanded AS MATERIALIZED (
                SELECT h.i, r.k, r.id, r.sequence_id, r.payload_bytes
                FROM unnest(v_heads, v_ns, v_keys, v_seqs, v_bytes)
                     WITH ORDINALITY AS h(id, namespace, ordering_key, sequence_id, payload_bytes, i)
                CROSS JOIN LATERAL (
                    SELECT h.id, 0::bigint AS k, h.sequence_id, h.payload_bytes
                    UNION ALL
                    SELECT f.id, f.k, f.sequence_id, f.payload_bytes
                    FROM (
                        SELECT q.id, q.sequence_id, q.payload_bytes,
                               row_number() OVER w AS k,
                               count(*) FILTER (WHERE q.lease_token IS NOT NULL OR q.next_attempt_at > v_now OR q.paused) OVER w AS misses
                        FROM (SELECT q.id, q.sequence_id, q.payload_bytes, q.lease_token, q.next_attempt_at, q.paused
                              FROM outbox.pending q
                              WHERE q.namespace = h.namespace AND q.ordering_key = h.ordering_key
                                AND q.sequence_id > h.sequence_id
                              ORDER BY q.sequence_id
                              LIMIT p_max_run - 1) q
                        WINDOW w AS (ORDER BY q.sequence_id ROWS UNBOUNDED PRECEDING)
                    ) f
                    WHERE f.misses = 0
                ) r
                LIMIT p_batch_size
            ),
            ranked AS (
                SELECT e.i, e.k, e.id, e.sequence_id, row_number() OVER w AS n,
                       sum(CASE WHEN e.payload_bytes > p_max_payload_bytes THEN 0 ELSE e.payload_bytes END) OVER w AS bytes
                FROM expanded e
                WINDOW w AS (ORDER BY e.i, e.k)
            ),
            taken AS (
                SELECT r.k, r.id, max(r.sequence_id) FILTER (WHERE r.k > 0) OVER (PARTITION BY r.i) AS through
                FROM ranked r
                WHERE r.n <= p_batch_size AND (r.n = 1 OR p_max_bytes IS NULL OR r.bytes <= p_max_bytes)
            )
            SELECT array_agg(t.id) FILTER (WHERE t.k = 0), array_agg(t.through) FILTER (WHERE t.k = 0),
                   array_agg(t.id) FILTER (WHERE t.k > 0)
              INTO v_holders, v_through, v_behind
              FROM taken t;
        ELSE
            v_holders := v_ids;
        END IF;
    END IF;

    -- The lease, by primary key: joining the chosen rows instead lets the
    -- planner hash them against a sequential scan of the whole queue.
    IF v_behind IS NULL THEN
        RETURN QUERY
        UPDATE outbox.pending p
        SET claimed_by       = p_worker_id,
            lease_token      = v_token,
            lease_expires_at = v_now + make_interval(secs => p_lease_seconds),
            attempt_count    = p.attempt_count + 1
        WHERE p.id = ANY (v_holders)
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  CASE WHEN p.payload_bytes > p_max_payload_bytes THEN NULL ELSE p.payload END,
                  p.headers, p.trace_header, p.attempt_count, p.lease_token,
                  p.lease_expires_at, p.created_at, p.payload_bytes;
        RETURN;
    END IF;
    -- With runs: the heads leased, each with its run's extent, and the
    -- runs read as they will be when their outcomes are recorded (their
    -- attempt charged then: see above).
    RETURN QUERY
    WITH leased AS (
        UPDATE outbox.pending p
        SET claimed_by       = p_worker_id,
            lease_token      = v_token,
            lease_expires_at = v_now + make_interval(secs => p_lease_seconds),
            attempt_count    = p.attempt_count + 1,
            run_through      = x.through
        FROM unnest(v_holders, v_through) AS x(id, through)
        WHERE p.id = ANY (v_holders) AND p.id = x.id
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  CASE WHEN p.payload_bytes > p_max_payload_bytes THEN NULL ELSE p.payload END AS payload,
                  p.headers, p.trace_header, p.attempt_count, p.lease_token,
                  p.lease_expires_at, p.created_at, p.payload_bytes
    )
    SELECT l.* FROM leased l
    UNION ALL
    SELECT q.id, q.namespace, q.topic, q.tenant_id, q.dedupe_key, q.ordering_key, q.sequence_id,
           CASE WHEN q.payload_bytes > p_max_payload_bytes THEN NULL ELSE q.payload END,
           q.headers, q.trace_header, q.attempt_count + 1, v_token,
           v_now + make_interval(secs => p_lease_seconds), q.created_at, q.payload_bytes
    FROM outbox.pending q
    WHERE q.id = ANY (v_behind);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
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
--               after a message that was not delivered)
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
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
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

    -- The DELETE and the UPDATEs are the fence: each touches only rows still
    -- leased to this worker under the result's token and not yet expired
    -- (by the clock now, not the transaction's start). A row that a reaper
    -- or another worker changed meanwhile fails the re-check PostgreSQL
    -- makes after waiting for its lock, and is left alone: lease_lost.
    --
    -- A message of a run holds no lease of its own (see claim_batch): it is
    -- leased while its key's head is, under the result's token, to this
    -- worker, unexpired, with a run that reaches it (run_through). That
    -- probe is one descent of pending_key_head (a key's delivered messages
    -- leave dead entries at the front of its pending_key_sequence range,
    -- which a probe there would step over: quadratic in a hot key's
    -- backlog), written out in each statement: as a SQL function it would
    -- never be inlined (it has a subquery), and a call per message cost
    -- 66 us against 4.
    --
    -- Almost every batch is all DISPATCHED: it runs the first statement,
    -- which is the second one's DISPATCHED part alone (the other outcomes'
    -- statements cost a tenth of the call even when they find nothing).
    -- In both, the exceptions (lease_lost, dead, double_dispatch) are looked
    -- for only when the counts of what was written say there are any.
    PERFORM set_config('enable_nestloop', 'off', true), set_config('enable_mergejoin', 'off', true);
    IF p_outcomes <@ ARRAY['DISPATCHED'] THEN
        WITH removed AS (
            DELETE FROM outbox.pending p
            USING unnest(p_ids, p_lease_tokens, p_error_codes, p_error_messages, p_targets, p_target_refs,
                         p_latencies_ms)
                  WITH ORDINALITY AS r(id, lease_token, error_code, error_message, target, target_ref,
                                       latency_ms, ord)
            WHERE p.id = ANY (p_ids)
              AND p.id = r.id
              AND (p.lease_token = r.lease_token AND p.claimed_by = p_worker_id AND p.lease_expires_at > v_now
                   OR p.lease_token IS NULL
                      AND EXISTS (SELECT 1 FROM outbox.pending h   -- the run's head: see above
                                  WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key AND NOT h.behind
                                    AND h.sequence_id < p.sequence_id AND h.run_through >= p.sequence_id
                                    AND h.lease_token = r.lease_token AND h.claimed_by = p_worker_id
                                    AND h.lease_expires_at > v_now))
            RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                      p.attempt_count + (p.lease_token IS NULL)::int AS attempt_count,
                      r.error_code, left(r.error_message, 4096) AS error_message,
                      r.target, r.target_ref, r.latency_ms, r.ord,
                      p.run_through, p.lease_token, p.lease_expires_at
        ),
        -- The double-delivery backstop, per message: a second DISPATCHED
        -- for a message is not archived (attempts_one_dispatched_per_message),
        -- and only that message says so. The outcomes are archived in the
        -- results' order, whatever order the join found the rows in: a run's
        -- messages in sequence order, as they were delivered.
        archived AS (
            INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                         dedupe_key, ordering_key, sequence_id, target, target_ref,
                                         error_code, error_message, latency_ms)
            SELECT x.id, x.attempt_count, 'DISPATCHED', p_worker_id, x.namespace, x.topic, x.tenant_id,
                   x.dedupe_key, x.ordering_key, x.sequence_id, x.target, x.target_ref,
                   x.error_code, x.error_message, x.latency_ms
            FROM removed x
            ORDER BY x.ord
            ON CONFLICT (message_id) WHERE state = 'DISPATCHED' DO NOTHING
            RETURNING message_id
        ),
        tally AS (
            SELECT (SELECT count(*) FROM removed) AS removed, (SELECT count(*) FROM archived) AS archived
        ),
        exceptions AS (
            SELECT r.id, r.ord, 'lease_lost' AS status
            FROM unnest(p_ids) WITH ORDINALITY AS r(id, ord)
            WHERE (SELECT t.removed < cardinality(p_ids) FROM tally t)
              AND r.id NOT IN (SELECT x.id FROM removed x)
            UNION ALL
            SELECT x.id, x.ord, 'double_dispatch'
            FROM removed x
            WHERE (SELECT t.archived < t.removed FROM tally t)
              AND x.id NOT IN (SELECT a.message_id FROM archived a)
        )
        SELECT t.removed, e.ids, e.ords, e.statuses, k.namespaces, k.keys,
               k.run_ns, k.run_ok, k.run_seq, k.run_through, k.run_token, k.run_until
          INTO v_recorded, v_ids, v_ords, v_statuses, v_key_ns, v_key_ok,
               v_run_ns, v_run_ok, v_run_seq, v_run_through, v_run_token, v_run_until
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
              AND (p.lease_token = r.lease_token AND p.claimed_by = p_worker_id AND p.lease_expires_at > v_now
                   OR p.lease_token IS NULL
                      AND EXISTS (SELECT 1 FROM outbox.pending h   -- the run's head: see above
                                  WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key AND NOT h.behind
                                    AND h.sequence_id < p.sequence_id AND h.run_through >= p.sequence_id
                                    AND h.lease_token = r.lease_token AND h.claimed_by = p_worker_id
                                    AND h.lease_expires_at > v_now))
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
              AND (p.lease_token = r.lease_token AND p.claimed_by = p_worker_id AND p.lease_expires_at > v_now
                   OR p.lease_token IS NULL
                      AND EXISTS (SELECT 1 FROM outbox.pending h   -- the run's head: see above
                                  WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key AND NOT h.behind
                                    AND h.sequence_id < p.sequence_id AND h.run_through >= p.sequence_id
                                    AND h.lease_token = r.lease_token AND h.claimed_by = p_worker_id
                                    AND h.lease_expires_at > v_now))
              AND r.outcome = 'RETRYABLE'
              AND (p.attempt_count + (p.lease_token IS NULL)::int < p_max_attempts OR coalesce(r.hold, false))
            RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                      p.attempt_count, r.error_code, left(r.error_message, 4096) AS error_message,
                      r.target, r.target_ref, r.latency_ms, r.ord
        ),
        released AS (
            UPDATE outbox.pending p
            SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL, run_through = NULL,
                attempt_count = greatest(p.attempt_count - 1, 0)
            FROM unnest(p_ids, p_lease_tokens, p_outcomes) AS r(id, lease_token, outcome)
            WHERE 'RELEASED' = ANY (p_outcomes)
              AND p.id = ANY (p_ids)
              AND p.id = r.id
              AND p.lease_token = r.lease_token
              AND p.claimed_by = p_worker_id
              AND p.lease_expires_at > v_now
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
              AND EXISTS (SELECT 1 FROM outbox.pending h   -- the run's head: see above
                          WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key AND NOT h.behind
                            AND h.sequence_id < p.sequence_id AND h.run_through >= p.sequence_id
                            AND h.lease_token = r.lease_token AND h.claimed_by = p_worker_id
                            AND h.lease_expires_at > v_now)
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
        tally AS (
            SELECT (SELECT count(*) FROM removed) AS removed, (SELECT count(*) FROM rescheduled) AS rescheduled,
                   (SELECT count(*) FROM released) + (SELECT count(*) FROM released_behind) AS released,
                   (SELECT count(*) FROM archived) AS archived
        ),
        exceptions AS (
            SELECT r.id, r.ord, 'lease_lost' AS status
            FROM unnest(p_ids) WITH ORDINALITY AS r(id, ord)
            WHERE (SELECT t.removed + t.rescheduled + t.released < cardinality(p_ids) FROM tally t)
              AND r.id NOT IN (SELECT x.id FROM removed x UNION ALL SELECT q.id FROM rescheduled q
                               UNION ALL SELECT l.id FROM released l UNION ALL SELECT b.id FROM released_behind b)
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
        )
        SELECT t.removed + t.rescheduled + t.released, e.ids, e.ords, e.statuses, k.namespaces, k.keys,
               k.run_ns, k.run_ok, k.run_seq, k.run_through, k.run_token, k.run_until
          INTO v_recorded, v_ids, v_ords, v_statuses, v_key_ns, v_key_ok,
               v_run_ns, v_run_ok, v_run_seq, v_run_through, v_run_token, v_run_until
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
    -- were just deleted steps over each of them (35 us a run).
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

    -- A key whose message left pending has a new head (or is parked); a key
    -- a producer is committing to right now is left to the next claim.
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
-- +goose StatementEnd

-- +goose StatementBegin
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
    --    its key's lock (see above).
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
        v_ids := v_ids || ARRAY(
            SELECT q.id FROM outbox.pending q
            WHERE q.lease_token IS NOT NULL AND q.attempt_count >= 0 AND q.lease_expires_at = ANY (v_expiry)
              AND q.lease_token = ANY (v_tokens)
              AND octet_length(q.namespace) || ':' || q.namespace || q.ordering_key = ANY (v_owned)
            FOR UPDATE OF q SKIP LOCKED);
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
        SET attempt_count = f.attempt_count + 1
        FROM expired e
        WHERE e.run_through IS NOT NULL
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
           (SELECT array_agg(x.namespace) FROM removed x WHERE x.ordering_key IS NOT NULL),
           (SELECT array_agg(x.ordering_key) FROM removed x WHERE x.ordering_key IS NOT NULL)
      INTO v_repaired, v_key_ns, v_key_ok;

    -- A key whose message died here has a new head, or is parked (its lock
    -- is already this transaction's).
    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, false);
    END IF;
    RETURN v_repaired;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
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
-- message. A message leased right now is left alone (not returned): try
-- again when its delivery attempt is over.
#variable_conflict use_column
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_out    uuid[];
    v_from   text[];
    v_key_ns text[];
    v_key_ok text[];
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

    WITH from_dead AS (
        DELETE FROM outbox.dead d WHERE d.id = ANY (p_message_ids)
        RETURNING d.id, d.namespace, d.topic, d.tenant_id, d.dedupe_key, d.ordering_key, d.sequence_id,
                  d.attempt_count, d.last_error_code, d.last_error, 'dead' AS origin
    ),
    from_pending AS (
        DELETE FROM outbox.pending p
        WHERE p.id = ANY (p_message_ids) AND (p.lease_token IS NULL OR p.lease_expires_at <= v_now)
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.stats()
RETURNS TABLE(namespace text, topic text, pending bigint, due bigint, leased bigint,
              expired_leases bigint, oldest_pending_age_seconds double precision, dead bigint,
              blocked_keys bigint, oldest_blocked_key_age_seconds double precision,
              retrying bigint, paused bigint, top_error_code text, top_error_count bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH p AS (
        SELECT p.namespace, p.topic,
               count(*) AS pending,
               count(*) FILTER (WHERE p.lease_token IS NULL AND NOT p.behind AND NOT x.paused AND p.next_attempt_at <= now()) AS due,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL) AS leased,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL AND p.lease_expires_at <= clock_timestamp()) AS expired_leases,
               -- Age since the message became available, so that messages
               -- scheduled for later do not read as stuck, nor paused ones
               -- (paused counts them).
               extract(epoch FROM now() - min(p.available_at) FILTER (WHERE p.available_at <= now() AND NOT x.paused))::double precision AS oldest,
               -- Failed, and waiting for their next attempt.
               count(*) FILTER (WHERE p.lease_token IS NULL AND NOT x.paused AND p.last_error_code IS NOT NULL
                                  AND p.next_attempt_at > now()) AS retrying,
               count(*) FILTER (WHERE x.paused AND p.lease_token IS NULL) AS paused
        FROM outbox.pending p
        -- By the table as well as the mark: a message that missed its
        -- pause's mark is skipped by claims all the same (see pause()).
        CROSS JOIN LATERAL (SELECT p.paused
                                   OR (p.namespace, p.topic) IN (SELECT z.namespace, z.topic FROM outbox.paused z)
                                   OR (p.namespace, '*') IN (SELECT z.namespace, z.topic FROM outbox.paused z)) x(paused)
        GROUP BY p.namespace, p.topic
    ),
    -- The messages of runs, leased with their heads (see claim_batch).
    r AS (
        SELECT f.namespace, f.topic, count(*) AS leased,
               count(*) FILTER (WHERE h.lease_expires_at <= clock_timestamp()) AS expired_leases
        FROM outbox.pending h
        JOIN outbox.pending f ON f.namespace = h.namespace AND f.ordering_key = h.ordering_key
                             AND f.sequence_id > h.sequence_id AND f.sequence_id <= h.run_through
                             AND f.lease_token IS NULL
        WHERE h.lease_token IS NOT NULL AND h.attempt_count >= 0 AND h.run_through IS NOT NULL
        GROUP BY f.namespace, f.topic
    ),
    d AS (
        SELECT d.namespace, d.topic, count(*) AS dead
        FROM outbox.dead d
        GROUP BY d.namespace, d.topic
    ),
    -- Blocked keys, as blocked_keys() lists them, count under the topic of
    -- the message each waits on.
    b AS (
        SELECT x.namespace, x.topic, count(*) AS blocked,
               extract(epoch FROM clock_timestamp() - min(x.since))::double precision AS oldest
        FROM outbox.blocked_key_states(NULL) x
        GROUP BY x.namespace, x.topic
    ),
    -- The most frequent last error code among each topic's pending
    -- messages and dead letters (ties: the first code by name).
    e AS (
        SELECT DISTINCT ON (c.namespace, c.topic) c.namespace, c.topic, c.code, c.n
        FROM (SELECT u.namespace, u.topic, u.code, count(*) AS n
              FROM (SELECT q.namespace, q.topic, q.last_error_code AS code FROM outbox.pending q WHERE q.last_error_code IS NOT NULL
                    UNION ALL
                    SELECT r.namespace, r.topic, r.last_error_code FROM outbox.dead r WHERE r.last_error_code IS NOT NULL) u
              GROUP BY u.namespace, u.topic, u.code) c
        ORDER BY c.namespace, c.topic, c.n DESC, c.code
    ),
    pairs AS (
        SELECT p.namespace, p.topic FROM p UNION SELECT d.namespace, d.topic FROM d
        UNION SELECT b.namespace, b.topic FROM b
    )
    SELECT k.namespace, k.topic,
           coalesce(p.pending, 0), coalesce(p.due, 0), coalesce(p.leased, 0) + coalesce(r.leased, 0),
           coalesce(p.expired_leases, 0) + coalesce(r.expired_leases, 0), coalesce(greatest(p.oldest, 0), 0), coalesce(d.dead, 0),
           coalesce(b.blocked, 0), coalesce(greatest(b.oldest, 0), 0),
           coalesce(p.retrying, 0), coalesce(p.paused, 0), e.code, coalesce(e.n, 0)
    FROM pairs k
    LEFT JOIN p ON p.namespace = k.namespace AND p.topic = k.topic
    LEFT JOIN r ON r.namespace = k.namespace AND r.topic = k.topic
    LEFT JOIN d ON d.namespace = k.namespace AND d.topic = k.topic
    LEFT JOIN b ON b.namespace = k.namespace AND b.topic = k.topic
    LEFT JOIN e ON e.namespace = k.namespace AND e.topic = k.topic
    ORDER BY 1, 2
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.pending_messages(
    p_namespace    text DEFAULT NULL,
    p_topic        text DEFAULT NULL,
    p_ordering_key text DEFAULT NULL,
    p_retrying     boolean DEFAULT false,
    p_blocked      boolean DEFAULT false,
    p_older_than   interval DEFAULT NULL,
    p_limit        int DEFAULT 100,
    p_message_ids  uuid[] DEFAULT NULL)
RETURNS TABLE(id uuid, namespace text, topic text, tenant_id text, dedupe_key text, ordering_key text,
              sequence_id bigint, state text, attempt_count int, last_error_code text, last_error text,
              created_at timestamptz, available_at timestamptz, next_attempt_at timestamptz,
              claimed_by text, lease_expires_at timestamptz,
              head_id uuid, head_sequence_id bigint, head_state text, head_error_code text,
              matched bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Pending messages for an operator, longest available first, with the
-- filters combined by AND: namespace, topic, ordering key, retrying (failed
-- at least once), blocked (its ordering key is: see blocked_key_states),
-- available longer ago than p_older_than, or the ids. state is one of
--   leased         a dispatcher holds it now (itself, or with its run's head)
--   lease_expired  its dispatcher held it past the lease; the next claim or the reaper takes it back
--   paused         its namespace or topic is paused (outbox.pauses())
--   behind         an earlier message of its ordering key goes first: head_* name it
--   retrying       it failed and waits for its next attempt (next_attempt_at)
--   scheduled      its producer made it available later
--   due            waiting for a claim now
-- For an ordered message that is behind, head_* describe what its key
-- waits on: the key's head (its state as above) or its parked dead letter
-- (head_state parked), or nothing yet (unsettled: the next claim settles
-- it). matched counts every message the filters match, beyond the limit.
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION 'outbox.pending_messages: p_limit must be between 1 and 10000, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_older_than < interval '0' THEN
        RAISE EXCEPTION 'outbox.pending_messages: p_older_than must not be negative, got %', p_older_than
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH blocked AS (
        SELECT b.namespace, b.ordering_key FROM outbox.blocked_key_states(p_namespace) b WHERE p_blocked
    ),
    picked AS (
        SELECT p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
               p.attempt_count, p.last_error_code, p.last_error, p.created_at, p.available_at, p.next_attempt_at,
               p.claimed_by, p.lease_token, p.lease_expires_at, p.paused, p.behind,
               count(*) OVER () AS matched
        FROM outbox.pending p
        WHERE (p_message_ids IS NULL OR p.id = ANY (p_message_ids))
          AND (p_namespace IS NULL OR p.namespace = p_namespace)
          AND (p_topic IS NULL OR p.topic = p_topic)
          AND (p_ordering_key IS NULL OR p.ordering_key = p_ordering_key)
          AND (NOT coalesce(p_retrying, false) OR p.last_error_code IS NOT NULL)
          AND (NOT coalesce(p_blocked, false)
               OR (p.namespace, p.ordering_key) IN (SELECT b.namespace, b.ordering_key FROM blocked b))
          AND (p_older_than IS NULL OR p.available_at <= v_now - p_older_than)
        ORDER BY p.available_at, p.id
        LIMIT p_limit
    )
    SELECT m.id, m.namespace, m.topic, m.tenant_id, m.dedupe_key, m.ordering_key, m.sequence_id,
           -- A message of a run leased with its head (see claim_batch) is
           -- as leased as its head.
           CASE WHEN h.run_through >= m.sequence_id AND h.sequence_id < m.sequence_id
                THEN outbox.pending_state(h.lease_token, h.lease_expires_at, false, false, m.next_attempt_at, NULL, v_now)
                ELSE outbox.pending_state(m.lease_token, m.lease_expires_at, m.paused OR outbox.is_paused(m.namespace, m.topic),
                                          m.behind, m.next_attempt_at, m.last_error_code, v_now)
           END,
           m.attempt_count, m.last_error_code, m.last_error, m.created_at, m.available_at, m.next_attempt_at,
           CASE WHEN h.run_through >= m.sequence_id AND h.sequence_id < m.sequence_id THEN h.claimed_by ELSE m.claimed_by END,
           CASE WHEN h.run_through >= m.sequence_id AND h.sequence_id < m.sequence_id THEN h.lease_expires_at ELSE m.lease_expires_at END,
           h.id, h.sequence_id, h.state, h.error_code,
           m.matched
    FROM picked m
    LEFT JOIN LATERAL (
        SELECT x.id, x.sequence_id, x.state, x.error_code, x.claimed_by, x.lease_token, x.lease_expires_at, x.run_through
        FROM (
            SELECT 1 AS rank, q.id, q.sequence_id, q.claimed_by, q.lease_token, q.lease_expires_at, q.run_through,
                   outbox.pending_state(q.lease_token, q.lease_expires_at, q.paused OR outbox.is_paused(q.namespace, q.topic),
                                        false, q.next_attempt_at, q.last_error_code, v_now) AS state,
                   q.last_error_code AS error_code
            FROM outbox.pending q
            WHERE q.namespace = m.namespace AND q.ordering_key = m.ordering_key AND NOT q.behind
            UNION ALL
            SELECT 2, d.id, d.sequence_id, NULL, NULL, NULL, NULL, 'parked', d.last_error_code
            FROM outbox.dead d
            WHERE d.namespace = m.namespace AND d.ordering_key = m.ordering_key AND d.holds_key
            UNION ALL
            SELECT 3, NULL, NULL, NULL, NULL, NULL, NULL, 'unsettled', NULL
        ) x
        ORDER BY x.rank
        LIMIT 1
    ) h ON m.behind
    ORDER BY m.available_at, m.id;
END;
$$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL ROLE outbox_owner;
-- Runs leased now lease each of their messages again, as before.
UPDATE outbox.pending f
SET claimed_by = h.claimed_by, lease_token = h.lease_token, lease_expires_at = h.lease_expires_at,
    attempt_count = f.attempt_count + 1
FROM outbox.pending h
WHERE h.run_through IS NOT NULL AND h.lease_token IS NOT NULL
  AND f.namespace = h.namespace AND f.ordering_key = h.ordering_key
  AND f.sequence_id > h.sequence_id AND f.sequence_id <= h.run_through AND f.lease_token IS NULL;

-- Migration 8's claim_batch, migration 5's complete_batch,
-- requeue_expired_leases and discard, migration 7's stats and
-- pending_messages, verbatim.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.claim_batch(
    p_batch_size        int,
    p_worker_id         text,
    p_lease_seconds     int,
    p_namespaces        text[] DEFAULT NULL,
    p_max_run           int DEFAULT 1,
    p_max_bytes         bigint DEFAULT NULL,
    p_max_payload_bytes int DEFAULT NULL,
    p_max_attempts      int DEFAULT 100)
RETURNS TABLE(id uuid, namespace text, topic text, tenant_id text, dedupe_key text,
              ordering_key text, sequence_id bigint, payload jsonb, headers jsonb,
              trace_header text, attempt_count int, lease_token uuid,
              lease_expires_at timestamptz, created_at timestamptz, payload_bytes int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- One plan per statement and session: planning afresh on every call cost a
-- hot key's claim of 100 more than running it (2.0 ms against 1.5 ms with
-- the plan cached). A generic plan cannot see the LIMIT, and would walk the
-- queue and sort it; with sequential scans and sorts refused below, every
-- statement is planned as the walk of its index that it must be (the claim
-- index in (next_attempt_at, id) order, a key's run in sequence order, the
-- lease by primary key), whatever the statistics said when it was planned.
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
-- Every statement here reads at most p_batch_size heads and their runs by
-- index, which a JIT compilation (tens of milliseconds, not cached between
-- calls) never repays. The planner cannot know that: it estimates the runs
-- behind the heads from the table's statistics, and one long key (a stuck
-- head with its backlog) lifts the estimate past jit_above_cost.
SET jit = off
-- Its statements find rows by index (the claim index, a key's run, the
-- lease by primary key); statistics taken while pending was nearly empty
-- made the lease's UPDATE ... WHERE id = ANY scan the whole queue.
SET enable_seqscan = off
AS $$
-- Claims up to p_batch_size messages: due heads and unordered messages in
-- (next_attempt_at, id) order, each ordered head followed by up to
-- p_max_run - 1 of the messages queued behind it (its run, in sequence
-- order, stopping at the first that is not due, leased, paused or
-- lockable: a key's messages may span topics, and one topic be paused), all
-- under one lease token. The claim stops before its payloads would exceed
-- p_max_bytes (it always takes at least one message). A message whose
-- payload is larger than p_max_payload_bytes (the most any route may send)
-- is claimed without its payload (NULL) and does not count against
-- p_max_bytes: the dispatcher dead-letters it without loading it.
--
-- Takeover. Leases of p_namespaces that expired (a dispatcher crashed or
-- overran) are taken over first, up to p_batch_size rows and the rest of
-- any ordered run the limit cut (a run goes whole), exactly as the reaper
-- does (outbox.requeue_expired_leases, with p_max_attempts the attempt
-- ceiling): a ZOMBIE_REQUEUE each, naming the holder, or a LEASE_EXPIRED
-- dead letter at the ceiling. They are due now, so this claim may take
-- them back at once. Without an expired lease this costs one probe of
-- pending_lease_expiry.
--
-- Cost. Two ways to the same claim, chosen by the first claimable head
-- (one probe of pending_claimable and one of pending_key_sequence):
--  * It is an ordered head with messages behind it (a queue of ordered
--    keys): the heads are read and locked one by one, each followed at once
--    by its run, until the batch is full. 40 keys of 25 fill a batch of
--    1000: 40 heads are locked, not 1000, and nothing is read twice.
--  * Otherwise (unordered messages, or keys of one message each): the
--    heads are locked as an unordered claim locks its rows, up to
--    p_batch_size of them; the runs of any ordered heads among them are then
--    read and locked only as far as the batch takes them.
-- Either way a head locked but not taken is left as it was (a concurrent
-- claim skips it until this one commits).
#variable_conflict use_column
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_token   uuid := gen_random_uuid();
    v_ids     uuid[];
    v_ordered boolean;
    v_runs    boolean := false;
    v_heads   uuid[];
    v_ns      text[];
    v_keys    text[];
    v_seqs    bigint[];
    v_bytes   int[];
    -- Whether anything is paused: without a pause (almost always), the
    -- heads' pause filter below is never evaluated.
    v_paused  boolean := EXISTS (SELECT 1 FROM outbox.paused);
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
    IF p_max_run IS NULL OR p_max_run < 1 OR p_max_run > 10000 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_max_run must be between 1 and 10000, got %', p_max_run
            USING ERRCODE = '22023';
    END IF;
    IF p_max_bytes < 1 OR p_max_payload_bytes < 1 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_max_bytes and p_max_payload_bytes must be positive (or NULL), got % and %',
            p_max_bytes, p_max_payload_bytes USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_max_attempts must be at least 1, got %', p_max_attempts
            USING ERRCODE = '22023';
    END IF;

    -- Expired leases, taken over (see "Takeover" above). Almost never any.
    IF EXISTS (SELECT 1 FROM outbox.pending p
               WHERE p.lease_token IS NOT NULL AND p.attempt_count >= 0 AND p.lease_expires_at <= v_now
                 AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))) THEN
        PERFORM outbox.requeue_expired_leases(p_batch_size, p_worker_id, p_max_attempts, v_now, p_namespaces);
    END IF;

    -- Keys a dispatcher could not settle without waiting: settle them now,
    -- so that their heads are claimable. Almost always empty.
    IF EXISTS (SELECT 1 FROM outbox.unsettled_keys) THEN
        PERFORM outbox.settle_unsettled(100);
    END IF;

    -- Which way (see "Cost" above): does the first claimable head have a
    -- run behind it? Read without a lock; either way is correct whatever
    -- the answer, only the cost differs.
    IF p_max_run > 1 THEN
        SELECT EXISTS (SELECT 1 FROM outbox.pending q
                       WHERE q.namespace = p.namespace AND q.ordering_key = p.ordering_key
                         AND q.sequence_id > p.sequence_id)
          INTO v_runs
          FROM outbox.pending p
          WHERE p.lease_token IS NULL
            AND NOT p.behind
            AND NOT p.paused
            AND p.next_attempt_at <= v_now
            AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
          ORDER BY p.next_attempt_at, p.id
          LIMIT 1;
        v_runs := coalesce(v_runs, false);
    END IF;

    IF v_runs THEN
        -- The heads in order, each locked and followed by its run as the
        -- batch reaches it: the LIMIT of the runs stops the scan of the
        -- heads, so the heads behind the batch's last run are neither read
        -- nor locked. The runs are read, locked and cut exactly as in step 3
        -- below.
        v_ids := ARRAY(
        WITH heads AS (
            SELECT p.id, p.namespace, p.ordering_key, p.sequence_id, p.payload_bytes, p.next_attempt_at
            FROM outbox.pending p
            WHERE p.lease_token IS NULL
              AND NOT p.behind
              AND NOT p.paused
              AND p.next_attempt_at <= v_now
              AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
              AND (NOT v_paused OR NOT EXISTS (SELECT 1 FROM outbox.paused z
                                               WHERE z.namespace = p.namespace AND z.topic IN (p.topic, '*')))
            ORDER BY p.next_attempt_at, p.id
            LIMIT p_batch_size
            FOR UPDATE OF p SKIP LOCKED
        ),
        expanded AS MATERIALIZED (
            SELECT h.next_attempt_at AS due, h.id AS head, r.k, r.id, r.payload_bytes
            FROM heads h
            CROSS JOIN LATERAL (
                SELECT h.id, 0::bigint AS k, h.payload_bytes
                UNION ALL
                SELECT f.id, f.k, f.payload_bytes
                FROM (
                    SELECT q.id, q.ctid, q.payload_bytes,
                           row_number() OVER w AS k,
                           count(*) FILTER (WHERE q.lease_token IS NOT NULL OR q.next_attempt_at > v_now OR q.paused) OVER w AS misses
                    FROM (SELECT q.id, q.ctid, q.sequence_id, q.payload_bytes, q.lease_token, q.next_attempt_at, q.paused
                          FROM outbox.pending q
                          WHERE h.ordering_key IS NOT NULL
                            AND q.namespace = h.namespace AND q.ordering_key = h.ordering_key
                            AND q.sequence_id > h.sequence_id
                          ORDER BY q.sequence_id
                          LIMIT p_max_run - 1) q
                    WINDOW w AS (ORDER BY q.sequence_id ROWS UNBOUNDED PRECEDING)
                ) f
                CROSS JOIN LATERAL (
                    SELECT x.id FROM outbox.pending x
                    WHERE x.ctid = f.ctid AND x.id = f.id
                    FOR UPDATE SKIP LOCKED) l
                WHERE f.misses = 0
            ) r
            LIMIT p_batch_size
        ),
        unbroken AS (
            SELECT e.due, e.head, e.k, e.id, e.payload_bytes,
                   e.k = row_number() OVER (PARTITION BY e.head ORDER BY e.k) - 1 AS prefix
            FROM expanded e
        ),
        ranked AS (
            SELECT u.id, row_number() OVER w AS n,
                   sum(CASE WHEN u.payload_bytes > p_max_payload_bytes THEN 0 ELSE u.payload_bytes END) OVER w AS bytes
            FROM unbroken u
            WHERE u.prefix
            WINDOW w AS (ORDER BY u.due, u.head, u.k)
        )
        SELECT r.id FROM ranked r
        WHERE r.n <= p_batch_size AND (r.n = 1 OR p_max_bytes IS NULL OR r.bytes <= p_max_bytes));
    END IF;

    IF NOT v_runs THEN
        -- 1. The heads, locked until commit. Without an ordered head among
        --    them (or with runs of one) they are the claim, up to the byte
        --    budget; the arrays describe them, aligned, for the steps below.
        WITH heads AS (
            SELECT p.id, p.namespace, p.ordering_key, p.sequence_id, p.payload_bytes, p.next_attempt_at
            FROM outbox.pending p
            WHERE p.lease_token IS NULL
              AND NOT p.behind
              AND NOT p.paused
              AND p.next_attempt_at <= v_now
              AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
              -- A message committed while its namespace or topic was being
              -- paused can miss the pause's mark (see outbox.pause): it is
              -- skipped here until the next pause or resume marks it.
              AND (NOT v_paused OR NOT EXISTS (SELECT 1 FROM outbox.paused z
                                               WHERE z.namespace = p.namespace AND z.topic IN (p.topic, '*')))
            ORDER BY p.next_attempt_at, p.id
            LIMIT p_batch_size
            FOR UPDATE OF p SKIP LOCKED
        ),
        ranked AS (
            SELECT h.id, h.namespace, h.ordering_key, h.sequence_id, h.payload_bytes,
                   row_number() OVER w AS n,
                   sum(CASE WHEN h.payload_bytes > p_max_payload_bytes THEN 0 ELSE h.payload_bytes END) OVER w AS bytes
            FROM heads h
            WINDOW w AS (ORDER BY h.next_attempt_at, h.id)
        )
        SELECT array_agg(r.id) FILTER (WHERE r.n = 1 OR p_max_bytes IS NULL OR r.bytes <= p_max_bytes),
               coalesce(bool_or(r.ordering_key IS NOT NULL), false) AND p_max_run > 1,
               array_agg(r.id), array_agg(r.namespace), array_agg(r.ordering_key),
               array_agg(r.sequence_id), array_agg(r.payload_bytes)
          INTO v_ids, v_ordered, v_heads, v_ns, v_keys, v_seqs, v_bytes
          FROM ranked r;

        -- 2. Per-entity keys, one message each, have nothing behind their
        --    heads: then the heads are the claim all the same. One probe of
        --    pending_key_sequence per ordered head (an index-only scan) finds
        --    out, and the first head with a message behind it ends the search.
        IF v_ordered THEN
            v_ordered := EXISTS (
                SELECT 1 FROM unnest(v_ns, v_keys, v_seqs) AS h(namespace, ordering_key, sequence_id)
                WHERE h.ordering_key IS NOT NULL
                  AND EXISTS (SELECT 1 FROM outbox.pending q
                              WHERE q.namespace = h.namespace AND q.ordering_key = h.ordering_key
                                AND q.sequence_id > h.sequence_id));
        END IF;

        -- 3. The runs. The heads in order, each followed by its run, under a
        --    LIMIT of the batch: the nested loop expands a head only when the
        --    rows before it did not fill the batch, so the keys behind the
        --    batch's last run cost nothing, and a follower is locked only when
        --    its run is expanded. A run reads its followers in sequence order
        --    and stops at the first that is not due or leased: the window's
        --    run condition ends the scan there. One that another transaction
        --    holds (an operator discarding it) ends the run too, though the
        --    scan goes on past it.
        IF v_ordered THEN
            v_ids := ARRAY(
            WITH expanded AS MATERIALIZED (
                SELECT h.i, r.k, r.id, r.payload_bytes
                FROM unnest(v_heads, v_ns, v_keys, v_seqs, v_bytes)
                     WITH ORDINALITY AS h(id, namespace, ordering_key, sequence_id, payload_bytes, i)
                CROSS JOIN LATERAL (
                    SELECT h.id, 0::bigint AS k, h.payload_bytes
                    UNION ALL
                    SELECT f.id, f.k, f.payload_bytes
                    FROM (
                        SELECT q.id, q.ctid, q.payload_bytes,
                               row_number() OVER w AS k,
                               count(*) FILTER (WHERE q.lease_token IS NOT NULL OR q.next_attempt_at > v_now OR q.paused) OVER w AS misses
                        FROM (SELECT q.id, q.ctid, q.sequence_id, q.payload_bytes, q.lease_token, q.next_attempt_at, q.paused
                              FROM outbox.pending q
                              WHERE q.namespace = h.namespace AND q.ordering_key = h.ordering_key
                                AND q.sequence_id > h.sequence_id
                              ORDER BY q.sequence_id
                              LIMIT p_max_run - 1) q
                        WINDOW w AS (ORDER BY q.sequence_id ROWS UNBOUNDED PRECEDING)
                    ) f
                    -- Locked once it is known to be taken (a window reads a row
                    -- ahead); one that cannot be locked leaves a gap in k.
                    -- Found by the ctid just read rather than through
                    -- pending_pkey: the same row without an index descent.
                    CROSS JOIN LATERAL (
                        SELECT x.id FROM outbox.pending x
                        WHERE x.ctid = f.ctid AND x.id = f.id
                        FOR UPDATE SKIP LOCKED) l
                    WHERE f.misses = 0
                ) r
                LIMIT p_batch_size
            ),
            -- Each run is taken only as far as it is unbroken from the head
            -- (k = 0, 1, 2, ...): up to a follower that could not be locked,
            -- and up to where the LIMIT cut, whatever order the rows came in.
            -- A key's share of the claim is always a prefix of its run.
            unbroken AS (
                SELECT e.i, e.k, e.id, e.payload_bytes,
                       e.k = row_number() OVER (PARTITION BY e.i ORDER BY e.k) - 1 AS prefix
                FROM expanded e
            ),
            ranked AS (
                SELECT u.id, row_number() OVER w AS n,
                       sum(CASE WHEN u.payload_bytes > p_max_payload_bytes THEN 0 ELSE u.payload_bytes END) OVER w AS bytes
                FROM unbroken u
                WHERE u.prefix
                WINDOW w AS (ORDER BY u.i, u.k)
            )
            SELECT r.id FROM ranked r
            WHERE r.n <= p_batch_size AND (r.n = 1 OR p_max_bytes IS NULL OR r.bytes <= p_max_bytes));
        END IF;
    END IF;

    -- The lease, by primary key: joining the chosen rows instead lets the
    -- planner hash them against a sequential scan of the whole queue.
    RETURN QUERY
    UPDATE outbox.pending p
    SET claimed_by       = p_worker_id,
        lease_token      = v_token,
        lease_expires_at = v_now + make_interval(secs => p_lease_seconds),
        attempt_count    = p.attempt_count + 1
    WHERE p.id = ANY (v_ids)
    RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
              CASE WHEN p.payload_bytes > p_max_payload_bytes THEN NULL ELSE p.payload END,
              p.headers, p.trace_header, p.attempt_count, p.lease_token,
              p.lease_expires_at, p.created_at, p.payload_bytes;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
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
--               after a message that was not delivered)
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
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
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

    -- The DELETE and the UPDATEs are the fence: each touches only rows still
    -- leased to this worker under the result's token and not yet expired
    -- (by the clock now, not the transaction's start). A row that a reaper
    -- or another worker changed meanwhile fails the re-check PostgreSQL
    -- makes after waiting for its lock, and is left alone: lease_lost.
    --
    -- Almost every batch is all DISPATCHED: it runs the first statement,
    -- which is the second one's DISPATCHED part alone (the other outcomes'
    -- statements cost a tenth of the call even when they find nothing).
    -- In both, the exceptions (lease_lost, dead, double_dispatch) are looked
    -- for only when the counts of what was written say there are any.
    PERFORM set_config('enable_nestloop', 'off', true), set_config('enable_mergejoin', 'off', true);
    IF p_outcomes <@ ARRAY['DISPATCHED'] THEN
        WITH removed AS (
            DELETE FROM outbox.pending p
            USING unnest(p_ids, p_lease_tokens, p_error_codes, p_error_messages, p_targets, p_target_refs,
                         p_latencies_ms)
                  WITH ORDINALITY AS r(id, lease_token, error_code, error_message, target, target_ref,
                                       latency_ms, ord)
            WHERE p.id = ANY (p_ids)
              AND p.id = r.id
              AND p.lease_token = r.lease_token
              AND p.claimed_by = p_worker_id
              AND p.lease_expires_at > v_now
            RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                      p.attempt_count, r.error_code, left(r.error_message, 4096) AS error_message,
                      r.target, r.target_ref, r.latency_ms, r.ord
        ),
        -- The double-delivery backstop, per message: a second DISPATCHED
        -- for a message is not archived (attempts_one_dispatched_per_message),
        -- and only that message says so. The outcomes are archived in the
        -- results' order, whatever order the join found the rows in: a run's
        -- messages in sequence order, as they were delivered.
        archived AS (
            INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                         dedupe_key, ordering_key, sequence_id, target, target_ref,
                                         error_code, error_message, latency_ms)
            SELECT x.id, x.attempt_count, 'DISPATCHED', p_worker_id, x.namespace, x.topic, x.tenant_id,
                   x.dedupe_key, x.ordering_key, x.sequence_id, x.target, x.target_ref,
                   x.error_code, x.error_message, x.latency_ms
            FROM removed x
            ORDER BY x.ord
            ON CONFLICT (message_id) WHERE state = 'DISPATCHED' DO NOTHING
            RETURNING message_id
        ),
        tally AS (
            SELECT (SELECT count(*) FROM removed) AS removed, (SELECT count(*) FROM archived) AS archived
        ),
        exceptions AS (
            SELECT r.id, r.ord, 'lease_lost' AS status
            FROM unnest(p_ids) WITH ORDINALITY AS r(id, ord)
            WHERE (SELECT t.removed < cardinality(p_ids) FROM tally t)
              AND r.id NOT IN (SELECT x.id FROM removed x)
            UNION ALL
            SELECT x.id, x.ord, 'double_dispatch'
            FROM removed x
            WHERE (SELECT t.archived < t.removed FROM tally t)
              AND x.id NOT IN (SELECT a.message_id FROM archived a)
        )
        SELECT t.removed, e.ids, e.ords, e.statuses, k.namespaces, k.keys
          INTO v_recorded, v_ids, v_ords, v_statuses, v_key_ns, v_key_ok
          FROM tally t,
               (SELECT array_agg(e.id ORDER BY e.ord) AS ids, array_agg(e.ord::int ORDER BY e.ord) AS ords,
                       array_agg(e.status ORDER BY e.ord) AS statuses
                FROM exceptions e) e,
               (SELECT array_agg(x.namespace) AS namespaces, array_agg(x.ordering_key) AS keys
                FROM removed x WHERE x.ordering_key IS NOT NULL) k;
    ELSE
        -- The statements of outcomes absent from the batch are skipped
        -- whole (a one-time filter on the outcomes).
        WITH
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
              AND p.lease_token = r.lease_token
              AND p.claimed_by = p_worker_id
              AND p.lease_expires_at > v_now
              AND (r.outcome IN ('DISPATCHED', 'FAILED')
                   OR (r.outcome = 'RETRYABLE' AND p.attempt_count >= p_max_attempts AND NOT coalesce(r.hold, false)))
            -- A delivered row's payload is not needed past this point:
            -- carrying it through the CTEs costs more than the delete itself.
            RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                      CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.payload END AS payload,
                      p.payload_bytes,
                      CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.headers END AS headers,
                      p.trace_header, p.attempt_count, p.available_at, p.created_at,
                      r.outcome AS requested,
                      CASE WHEN r.outcome = 'DISPATCHED' THEN 'DISPATCHED' ELSE 'FAILED' END AS outcome,
                      p.ordering_key IS NOT NULL AND r.outcome <> 'DISPATCHED'
                          AND coalesce(r.on_dead = 'park', p.park_on_dead) AS parks,
                      r.error_code, left(r.error_message, 4096) AS error_message, r.target, r.target_ref,
                      r.latency_ms, r.ord
        ),
        rescheduled AS (
            UPDATE outbox.pending p
            SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
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
              AND p.lease_token = r.lease_token
              AND p.claimed_by = p_worker_id
              AND p.lease_expires_at > v_now
              AND r.outcome = 'RETRYABLE' AND (p.attempt_count < p_max_attempts OR coalesce(r.hold, false))
            RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                      p.attempt_count, r.error_code, left(r.error_message, 4096) AS error_message,
                      r.target, r.target_ref, r.latency_ms, r.ord
        ),
        released AS (
            UPDATE outbox.pending p
            SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
                attempt_count = greatest(p.attempt_count - 1, 0)
            FROM unnest(p_ids, p_lease_tokens, p_outcomes) AS r(id, lease_token, outcome)
            WHERE 'RELEASED' = ANY (p_outcomes)
              AND p.id = ANY (p_ids)
              AND p.id = r.id
              AND p.lease_token = r.lease_token
              AND p.claimed_by = p_worker_id
              AND p.lease_expires_at > v_now
              AND r.outcome = 'RELEASED'
            RETURNING p.id
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
        tally AS (
            SELECT (SELECT count(*) FROM removed) AS removed, (SELECT count(*) FROM rescheduled) AS rescheduled,
                   (SELECT count(*) FROM released) AS released, (SELECT count(*) FROM archived) AS archived
        ),
        exceptions AS (
            SELECT r.id, r.ord, 'lease_lost' AS status
            FROM unnest(p_ids) WITH ORDINALITY AS r(id, ord)
            WHERE (SELECT t.removed + t.rescheduled + t.released < cardinality(p_ids) FROM tally t)
              AND r.id NOT IN (SELECT x.id FROM removed x UNION ALL SELECT q.id FROM rescheduled q
                               UNION ALL SELECT l.id FROM released l)
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
        )
        SELECT t.removed + t.rescheduled + t.released, e.ids, e.ords, e.statuses, k.namespaces, k.keys
          INTO v_recorded, v_ids, v_ords, v_statuses, v_key_ns, v_key_ok
          FROM tally t,
               (SELECT array_agg(e.id ORDER BY e.ord) AS ids, array_agg(e.ord::int ORDER BY e.ord) AS ords,
                       array_agg(e.status ORDER BY e.ord) AS statuses
                FROM exceptions e) e,
               (SELECT array_agg(x.namespace) AS namespaces, array_agg(x.ordering_key) AS keys
                FROM removed x WHERE x.ordering_key IS NOT NULL) k;
    END IF;

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

    -- A key whose message left pending has a new head (or is parked); a key
    -- a producer is committing to right now is left to the next claim.
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
-- +goose StatementEnd

-- +goose StatementBegin
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
    --    its key's lock (see above).
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
        v_ids := v_ids || ARRAY(
            SELECT q.id FROM outbox.pending q
            WHERE q.lease_token IS NOT NULL AND q.attempt_count >= 0 AND q.lease_expires_at = ANY (v_expiry)
              AND q.lease_token = ANY (v_tokens)
              AND octet_length(q.namespace) || ':' || q.namespace || q.ordering_key = ANY (v_owned)
            FOR UPDATE OF q SKIP LOCKED);
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;

    -- 3. Requeued, or dead at the ceiling; archived either way.
    WITH expired AS (
        SELECT p.id, p.claimed_by AS held_by
        FROM outbox.pending p
        WHERE p.id = ANY (v_ids) AND p.lease_token IS NOT NULL AND p.lease_expires_at <= p_now
    ),
    requeued AS (
        UPDATE outbox.pending p
        SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_attempt_at = p_now,
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
        SELECT x.id, x.attempt_count, 'FAILED', p_worker_id, x.namespace, x.topic, x.tenant_id,
               x.dedupe_key, x.ordering_key, x.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || x.held_by || ' expired on attempt ' || x.attempt_count
                   || ', the attempt ceiling; moved to dead'
        FROM removed x
    )
    SELECT (SELECT count(*) FROM requeued) + (SELECT count(*) FROM removed),
           (SELECT array_agg(x.namespace) FROM removed x WHERE x.ordering_key IS NOT NULL),
           (SELECT array_agg(x.ordering_key) FROM removed x WHERE x.ordering_key IS NOT NULL)
      INTO v_repaired, v_key_ns, v_key_ok;

    -- A key whose message died here has a new head, or is parked (its lock
    -- is already this transaction's).
    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, false);
    END IF;
    RETURN v_repaired;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
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
-- message. A message leased right now is left alone (not returned): try
-- again when its delivery attempt is over.
#variable_conflict use_column
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_out    uuid[];
    v_from   text[];
    v_key_ns text[];
    v_key_ok text[];
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

    WITH from_dead AS (
        DELETE FROM outbox.dead d WHERE d.id = ANY (p_message_ids)
        RETURNING d.id, d.namespace, d.topic, d.tenant_id, d.dedupe_key, d.ordering_key, d.sequence_id,
                  d.attempt_count, d.last_error_code, d.last_error, 'dead' AS origin
    ),
    from_pending AS (
        DELETE FROM outbox.pending p
        WHERE p.id = ANY (p_message_ids) AND (p.lease_token IS NULL OR p.lease_expires_at <= v_now)
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.stats()
RETURNS TABLE(namespace text, topic text, pending bigint, due bigint, leased bigint,
              expired_leases bigint, oldest_pending_age_seconds double precision, dead bigint,
              blocked_keys bigint, oldest_blocked_key_age_seconds double precision,
              retrying bigint, paused bigint, top_error_code text, top_error_count bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH p AS (
        SELECT p.namespace, p.topic,
               count(*) AS pending,
               count(*) FILTER (WHERE p.lease_token IS NULL AND NOT p.behind AND NOT x.paused AND p.next_attempt_at <= now()) AS due,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL) AS leased,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL AND p.lease_expires_at <= clock_timestamp()) AS expired_leases,
               -- Age since the message became available, so that messages
               -- scheduled for later do not read as stuck, nor paused ones
               -- (paused counts them).
               extract(epoch FROM now() - min(p.available_at) FILTER (WHERE p.available_at <= now() AND NOT x.paused))::double precision AS oldest,
               -- Failed, and waiting for their next attempt.
               count(*) FILTER (WHERE p.lease_token IS NULL AND NOT x.paused AND p.last_error_code IS NOT NULL
                                  AND p.next_attempt_at > now()) AS retrying,
               count(*) FILTER (WHERE x.paused AND p.lease_token IS NULL) AS paused
        FROM outbox.pending p
        -- By the table as well as the mark: a message that missed its
        -- pause's mark is skipped by claims all the same (see pause()).
        CROSS JOIN LATERAL (SELECT p.paused
                                   OR (p.namespace, p.topic) IN (SELECT z.namespace, z.topic FROM outbox.paused z)
                                   OR (p.namespace, '*') IN (SELECT z.namespace, z.topic FROM outbox.paused z)) x(paused)
        GROUP BY p.namespace, p.topic
    ),
    d AS (
        SELECT d.namespace, d.topic, count(*) AS dead
        FROM outbox.dead d
        GROUP BY d.namespace, d.topic
    ),
    -- Blocked keys, as blocked_keys() lists them, count under the topic of
    -- the message each waits on.
    b AS (
        SELECT x.namespace, x.topic, count(*) AS blocked,
               extract(epoch FROM clock_timestamp() - min(x.since))::double precision AS oldest
        FROM outbox.blocked_key_states(NULL) x
        GROUP BY x.namespace, x.topic
    ),
    -- The most frequent last error code among each topic's pending
    -- messages and dead letters (ties: the first code by name).
    e AS (
        SELECT DISTINCT ON (c.namespace, c.topic) c.namespace, c.topic, c.code, c.n
        FROM (SELECT u.namespace, u.topic, u.code, count(*) AS n
              FROM (SELECT q.namespace, q.topic, q.last_error_code AS code FROM outbox.pending q WHERE q.last_error_code IS NOT NULL
                    UNION ALL
                    SELECT r.namespace, r.topic, r.last_error_code FROM outbox.dead r WHERE r.last_error_code IS NOT NULL) u
              GROUP BY u.namespace, u.topic, u.code) c
        ORDER BY c.namespace, c.topic, c.n DESC, c.code
    ),
    pairs AS (
        SELECT p.namespace, p.topic FROM p UNION SELECT d.namespace, d.topic FROM d
        UNION SELECT b.namespace, b.topic FROM b
    )
    SELECT k.namespace, k.topic,
           coalesce(p.pending, 0), coalesce(p.due, 0), coalesce(p.leased, 0),
           coalesce(p.expired_leases, 0), coalesce(greatest(p.oldest, 0), 0), coalesce(d.dead, 0),
           coalesce(b.blocked, 0), coalesce(greatest(b.oldest, 0), 0),
           coalesce(p.retrying, 0), coalesce(p.paused, 0), e.code, coalesce(e.n, 0)
    FROM pairs k
    LEFT JOIN p ON p.namespace = k.namespace AND p.topic = k.topic
    LEFT JOIN d ON d.namespace = k.namespace AND d.topic = k.topic
    LEFT JOIN b ON b.namespace = k.namespace AND b.topic = k.topic
    LEFT JOIN e ON e.namespace = k.namespace AND e.topic = k.topic
    ORDER BY 1, 2
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.pending_messages(
    p_namespace    text DEFAULT NULL,
    p_topic        text DEFAULT NULL,
    p_ordering_key text DEFAULT NULL,
    p_retrying     boolean DEFAULT false,
    p_blocked      boolean DEFAULT false,
    p_older_than   interval DEFAULT NULL,
    p_limit        int DEFAULT 100,
    p_message_ids  uuid[] DEFAULT NULL)
RETURNS TABLE(id uuid, namespace text, topic text, tenant_id text, dedupe_key text, ordering_key text,
              sequence_id bigint, state text, attempt_count int, last_error_code text, last_error text,
              created_at timestamptz, available_at timestamptz, next_attempt_at timestamptz,
              claimed_by text, lease_expires_at timestamptz,
              head_id uuid, head_sequence_id bigint, head_state text, head_error_code text,
              matched bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Pending messages for an operator, longest available first, with the
-- filters combined by AND: namespace, topic, ordering key, retrying (failed
-- at least once), blocked (its ordering key is: see blocked_key_states),
-- available longer ago than p_older_than, or the ids. state is one of
--   leased         a dispatcher holds it now
--   lease_expired  its dispatcher held it past the lease; the next claim or the reaper takes it back
--   paused         its namespace or topic is paused (outbox.pauses())
--   behind         an earlier message of its ordering key goes first: head_* name it
--   retrying       it failed and waits for its next attempt (next_attempt_at)
--   scheduled      its producer made it available later
--   due            waiting for a claim now
-- For an ordered message that is behind, head_* describe what its key
-- waits on: the key's head (its state as above) or its parked dead letter
-- (head_state parked), or nothing yet (unsettled: the next claim settles
-- it). matched counts every message the filters match, beyond the limit.
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION 'outbox.pending_messages: p_limit must be between 1 and 10000, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_older_than < interval '0' THEN
        RAISE EXCEPTION 'outbox.pending_messages: p_older_than must not be negative, got %', p_older_than
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH blocked AS (
        SELECT b.namespace, b.ordering_key FROM outbox.blocked_key_states(p_namespace) b WHERE p_blocked
    ),
    picked AS (
        SELECT p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
               p.attempt_count, p.last_error_code, p.last_error, p.created_at, p.available_at, p.next_attempt_at,
               p.claimed_by, p.lease_token, p.lease_expires_at, p.paused, p.behind,
               count(*) OVER () AS matched
        FROM outbox.pending p
        WHERE (p_message_ids IS NULL OR p.id = ANY (p_message_ids))
          AND (p_namespace IS NULL OR p.namespace = p_namespace)
          AND (p_topic IS NULL OR p.topic = p_topic)
          AND (p_ordering_key IS NULL OR p.ordering_key = p_ordering_key)
          AND (NOT coalesce(p_retrying, false) OR p.last_error_code IS NOT NULL)
          AND (NOT coalesce(p_blocked, false)
               OR (p.namespace, p.ordering_key) IN (SELECT b.namespace, b.ordering_key FROM blocked b))
          AND (p_older_than IS NULL OR p.available_at <= v_now - p_older_than)
        ORDER BY p.available_at, p.id
        LIMIT p_limit
    )
    SELECT m.id, m.namespace, m.topic, m.tenant_id, m.dedupe_key, m.ordering_key, m.sequence_id,
           outbox.pending_state(m.lease_token, m.lease_expires_at, m.paused OR outbox.is_paused(m.namespace, m.topic),
                                m.behind, m.next_attempt_at, m.last_error_code, v_now),
           m.attempt_count, m.last_error_code, m.last_error, m.created_at, m.available_at, m.next_attempt_at,
           m.claimed_by, m.lease_expires_at,
           h.id, h.sequence_id, h.state, h.error_code,
           m.matched
    FROM picked m
    LEFT JOIN LATERAL (
        SELECT x.id, x.sequence_id, x.state, x.error_code
        FROM (
            SELECT 1 AS rank, q.id, q.sequence_id,
                   outbox.pending_state(q.lease_token, q.lease_expires_at, q.paused OR outbox.is_paused(q.namespace, q.topic),
                                        false, q.next_attempt_at, q.last_error_code, v_now) AS state,
                   q.last_error_code AS error_code
            FROM outbox.pending q
            WHERE q.namespace = m.namespace AND q.ordering_key = m.ordering_key AND NOT q.behind
            UNION ALL
            SELECT 2, d.id, d.sequence_id, 'parked', d.last_error_code
            FROM outbox.dead d
            WHERE d.namespace = m.namespace AND d.ordering_key = m.ordering_key AND d.holds_key
            UNION ALL
            SELECT 3, NULL, NULL, 'unsettled', NULL
        ) x
        ORDER BY x.rank
        LIMIT 1
    ) h ON m.behind
    ORDER BY m.available_at, m.id;
END;
$$;
-- +goose StatementEnd

ALTER TABLE outbox.pending DROP COLUMN run_through;
