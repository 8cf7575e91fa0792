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
-- One plan per statement and session: planning afresh on every call costs a
-- small claim more than running it (docs/PERFORMANCE.md). A generic plan
-- cannot see the LIMIT, and would walk the
-- queue and sort it; with sequential scans and sorts refused below, every
-- statement is planned as the walk of its index that it must be (the claim
-- index in (next_attempt_at, id) order, a key's run in sequence order, the
-- lease by primary key), whatever the statistics said when it was planned.
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
-- Every statement here reads at most p_batch_size heads and their runs by
-- index, which a JIT compilation (not cached between calls) never repays. The planner cannot know that: it estimates the runs
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
-- cost less than an unordered one of the same size (docs/PERFORMANCE.md).
--
-- Bytes. The claim stops before its payloads (as stored: payload_bytes)
-- would exceed p_max_bytes, 64 MiB when NULL, so that no claim can load
-- more than a batch's worth of payloads (it always takes at least one
-- message). A message whose payload is larger than p_max_payload_bytes
-- (the most any route may send) is claimed without its payload (NULL) and
-- does not count against p_max_bytes: the dispatcher dead-letters it
-- without loading it.
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
-- (one probe of pending_claimable and one of pending_key_sequence; with no
-- ordered key's head pending, one of pending_key_head instead):
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
    v_head_bytes bigint;
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
    p_max_bytes := coalesce(p_max_bytes, 67108864);
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
    -- the answer, only the cost differs. Under concurrent claims the first
    -- claimable head lies past the rows the others hold and the old
    -- versions of rows just claimed, which this probe would step over once
    -- more before the claim's own scan does (1.3-1.5 index entries a
    -- message at 4 connections): without an ordered key's head in the
    -- queue, one descent of pending_key_head answers instead.
    IF p_max_run > 1 AND EXISTS (SELECT 1 FROM outbox.pending k
                                 WHERE k.ordering_key IS NOT NULL AND NOT k.behind) THEN
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
                    FROM (SELECT q.id, q.sequence_id, q.payload_bytes, q.lease_token, q.next_attempt_at,
                                 -- A message committed while its topic was being paused can
                                 -- miss the pause's mark: the pause itself is looked up too.
                                 q.paused OR v_paused AND EXISTS (SELECT 1 FROM outbox.paused z
                                                                  WHERE z.namespace = q.namespace AND z.topic IN (q.topic, '*')) AS paused
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
        )
        -- The heads come out of the lock in the claim index's order, and the
        -- arrays keep it. The byte budget is summed without a window: a
        -- window over the locked heads sorts them again (the planner cannot
        -- know that the lock keeps the index's order) and copies them into
        -- its buffer, a few per cent of an unordered claim's CPU for a cut
        -- that almost never happens. Only when the heads' payloads exceed
        -- p_max_bytes is the claim cut, as before, at the running sum in
        -- that order.
        SELECT sum(CASE WHEN h.payload_bytes > p_max_payload_bytes THEN 0 ELSE h.payload_bytes END),
               coalesce(bool_or(h.ordering_key IS NOT NULL), false) AND p_max_run > 1,
               array_agg(h.id), array_agg(h.namespace), array_agg(h.ordering_key),
               array_agg(h.sequence_id), array_agg(h.payload_bytes)
          INTO v_head_bytes, v_ordered, v_heads, v_ns, v_keys, v_seqs, v_bytes
          FROM heads h;
        v_ids := v_heads;
        IF v_head_bytes > p_max_bytes THEN
            v_ids := ARRAY(
                SELECT r.id
                FROM (SELECT h.id, row_number() OVER w AS n,
                             sum(CASE WHEN h.payload_bytes > p_max_payload_bytes THEN 0 ELSE h.payload_bytes END) OVER w AS bytes
                      FROM unnest(v_heads, v_bytes) WITH ORDINALITY AS h(id, payload_bytes, i)
                      WINDOW w AS (ORDER BY h.i ROWS UNBOUNDED PRECEDING)) r
                WHERE r.n = 1 OR r.bytes <= p_max_bytes);
        END IF;

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
                        FROM (SELECT q.id, q.sequence_id, q.payload_bytes, q.lease_token, q.next_attempt_at,
                                 -- A message committed while its topic was being paused can
                                 -- miss the pause's mark: the pause itself is looked up too.
                                 q.paused OR v_paused AND EXISTS (SELECT 1 FROM outbox.paused z
                                                                  WHERE z.namespace = q.namespace AND z.topic IN (q.topic, '*')) AS paused
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
REVOKE ALL ON FUNCTION outbox.claim_batch(p_batch_size integer, p_worker_id text, p_lease_seconds integer, p_namespaces text[], p_max_run integer, p_max_bytes bigint, p_max_payload_bytes integer, p_max_attempts integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.claim_batch(p_batch_size integer, p_worker_id text, p_lease_seconds integer, p_namespaces text[], p_max_run integer, p_max_bytes bigint, p_max_payload_bytes integer, p_max_attempts integer) TO outbox_dispatcher;
