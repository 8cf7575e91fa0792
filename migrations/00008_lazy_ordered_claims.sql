-- Ordered claims lock only the heads they take; settling names each key once.
--
-- claim_batch: a queue of ordered keys (the first claimable head has a run
-- behind it) is claimed head by head, each head locked and followed by its
-- run as the batch reaches it, so that a batch of 1000 filled by 40 runs of
-- 25 locks 40 heads instead of 1000 (see its "Cost"). Unordered claims are
-- unchanged. settle_keys settles each key once however many times the
-- caller names it (a completion names a key once per message of its run).
-- settle_keys also computes each key's rightful head once rather than once per
-- aggregate that reads it. Same signatures, same results: only the cost
-- changes.

-- +goose Up
SET LOCAL ROLE outbox_owner;

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
-- settle_keys makes each key's lowest pending message its head, unless the
-- key is parked or its head is in flight (leased), and returns how many keys
-- it could not settle. p_wait decides what happens when another transaction
-- holds a key's lock: wait for it (producers at commit, operators, who took
-- the lock first anyway), or record the debt in outbox.unsettled_keys
-- (dispatchers, which must never wait for a producer's transaction). Not
-- executable by any runtime role; the outbox functions call it as its owner.
-- A producer's commit runs it for its key: it costs only the statements a
-- key's state calls for.
CREATE OR REPLACE FUNCTION outbox.settle_keys(p_namespaces text[], p_keys text[], p_wait boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Restores the caller's setting on return: see the set_config below.
SET plan_cache_mode = auto
-- Every statement here finds rows by key. A plan cached while a table was
-- nearly empty would scan it in full until the next ANALYZE (20,000 rows
-- later, for outbox.pending): never scan a table where an index will do.
-- That makes a plan's cost look huge, which must not buy it a JIT
-- compilation (100 ms and more for a statement of microseconds).
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_ns      text[];
    v_ok      text[];
    v_missed  integer := 0;
    v_head    uuid[];
    v_want    uuid[];
    v_change  boolean;
    v_headless boolean;
    v_demoted uuid[];
BEGIN
    IF coalesce(cardinality(p_keys), 0) = 0 THEN
        RETURN 0;
    END IF;
    -- Each key once: a completion names a key once per message of its run
    -- (1,000 names for 40 keys), and every statement below would carry them
    -- all; the count of keys locked is compared with it, too.
    IF cardinality(p_keys) > 1 THEN
        SELECT array_agg(k.ns), array_agg(k.ok) INTO p_namespaces, p_keys
          FROM (SELECT DISTINCT x.ns, x.ok FROM unnest(p_namespaces, p_keys) AS x(ns, ok)) k;
    END IF;
    -- Many keys (a completion's) are joined with the tables: plan for the
    -- data at hand. One key (a producer's commit) is a few primary-key
    -- probes, whose generic plans are right and not worth planning anew.
    PERFORM set_config('plan_cache_mode', CASE WHEN cardinality(p_keys) > 1 THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);

    -- 1. Lock the keys' rows, in key order so that settlers never deadlock.
    IF p_wait THEN
        INSERT INTO outbox.keys (namespace, ordering_key)
        SELECT DISTINCT k.ns, k.ok FROM unnest(p_namespaces, p_keys) AS k(ns, ok) ORDER BY 1, 2
        ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING;
        SELECT array_agg(x.namespace ORDER BY x.namespace, x.ordering_key),
               array_agg(x.ordering_key ORDER BY x.namespace, x.ordering_key)
          INTO v_ns, v_ok
          FROM (SELECT k.namespace, k.ordering_key FROM outbox.keys k
                WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(p_namespaces, p_keys))
                ORDER BY 1, 2
                FOR UPDATE) x;
    ELSE
        SELECT array_agg(x.namespace ORDER BY x.namespace, x.ordering_key),
               array_agg(x.ordering_key ORDER BY x.namespace, x.ordering_key)
          INTO v_ns, v_ok
          FROM (SELECT k.namespace, k.ordering_key FROM outbox.keys k
                WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(p_namespaces, p_keys))
                ORDER BY 1, 2
                FOR UPDATE SKIP LOCKED) x;
        -- Keys not locked are someone else's right now: owe them a settle.
        IF coalesce(cardinality(v_ns), 0) < cardinality(p_keys) THEN
            INSERT INTO outbox.unsettled_keys (namespace, ordering_key)
            SELECT DISTINCT k.ns, k.ok FROM unnest(p_namespaces, p_keys) AS k(ns, ok)
            WHERE NOT EXISTS (SELECT 1 FROM unnest(v_ns, v_ok) AS l(ns, ok) WHERE l.ns = k.ns AND l.ok = k.ok);
            GET DIAGNOSTICS v_missed = ROW_COUNT;
        END IF;
    END IF;
    IF v_ns IS NULL THEN
        RETURN v_missed;
    END IF;

    -- 2. With the locks held, a new statement sees every committed change to
    --    these keys: find each key's head and the message that should be
    --    its head (none while the key is parked; the head itself while a
    --    claim holds it).
    SELECT array_agg(s.head ORDER BY s.i), array_agg(s.want ORDER BY s.i),
           bool_or(s.want IS DISTINCT FROM s.head), bool_or(s.want IS NULL)
      INTO v_head, v_want, v_change, v_headless
      FROM (SELECT k.i, h.id AS head,
                   CASE WHEN EXISTS (SELECT 1 FROM outbox.dead d
                                     WHERE d.namespace = k.ns AND d.ordering_key = k.ok AND d.holds_key) THEN NULL
                        WHEN h.lease_token IS NOT NULL THEN h.id
                        ELSE (SELECT p.id FROM outbox.pending p
                              WHERE p.namespace = k.ns AND p.ordering_key = k.ok
                              ORDER BY p.sequence_id LIMIT 1)
                   END AS want
            FROM unnest(v_ns, v_ok) WITH ORDINALITY AS k(ns, ok, i)
            LEFT JOIN outbox.pending h ON h.namespace = k.ns AND h.ordering_key = k.ok AND NOT h.behind
            -- Each key's want computed once: flattened, the subquery's CASE
            -- would be evaluated again for every aggregate that reads it
            -- (three times, each scanning the key's messages just deleted).
            OFFSET 0) s;

    -- 3. Demote a head that should not be one (a replayed message with a
    --    lower sequence id goes first), unless a claim leased it meanwhile:
    --    then it is in flight and stays the head. Then promote the rightful
    --    head where the key has none now. Two statements, in this order, so
    --    that pending_key_head never sees two heads of one key.
    IF v_change THEN
        WITH demoted AS (
            UPDATE outbox.pending p SET behind = true
            FROM unnest(v_head, v_want) AS x(head, want)
            WHERE p.id = x.head AND x.want IS DISTINCT FROM x.head AND p.lease_token IS NULL
            RETURNING p.id
        )
        SELECT array_agg(d.id) INTO v_demoted FROM demoted d;
        UPDATE outbox.pending p SET behind = false
        FROM unnest(v_head, v_want) AS x(head, want)
        WHERE p.id = x.want AND x.want IS DISTINCT FROM x.head
          AND (x.head IS NULL OR x.head = ANY (v_demoted));
    END IF;

    -- 4. A key left without a head: mark the change for producers at
    --    REPEATABLE READ (see outbox.keys).
    IF v_headless THEN
        UPDATE outbox.keys k SET settled_at = clock_timestamp()
        FROM unnest(v_ns, v_ok, v_want) AS x(ns, ok, want)
        WHERE k.namespace = x.ns AND k.ordering_key = x.ok AND x.want IS NULL;
    END IF;
    RETURN v_missed;
END;
$$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL ROLE outbox_owner;
-- Migration 7's claim_batch and migration 5's settle_keys, verbatim.
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
-- Cost. The heads are locked as an unordered claim locks its rows (up to
-- p_batch_size of them); the runs are read and locked only as far as the
-- batch takes them: 40 keys of 25 fill a batch of 1000 whatever number of
-- heads are due. A head locked but not taken is left as it was (a
-- concurrent claim skips it until this one commits).
#variable_conflict use_column
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_token   uuid := gen_random_uuid();
    v_ids     uuid[];
    v_ordered boolean;
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
-- settle_keys makes each key's lowest pending message its head, unless the
-- key is parked or its head is in flight (leased), and returns how many keys
-- it could not settle. p_wait decides what happens when another transaction
-- holds a key's lock: wait for it (producers at commit, operators, who took
-- the lock first anyway), or record the debt in outbox.unsettled_keys
-- (dispatchers, which must never wait for a producer's transaction). Not
-- executable by any runtime role; the outbox functions call it as its owner.
-- A producer's commit runs it for its key: it costs only the statements a
-- key's state calls for.
CREATE OR REPLACE FUNCTION outbox.settle_keys(p_namespaces text[], p_keys text[], p_wait boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Restores the caller's setting on return: see the set_config below.
SET plan_cache_mode = auto
-- Every statement here finds rows by key. A plan cached while a table was
-- nearly empty would scan it in full until the next ANALYZE (20,000 rows
-- later, for outbox.pending): never scan a table where an index will do.
-- That makes a plan's cost look huge, which must not buy it a JIT
-- compilation (100 ms and more for a statement of microseconds).
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_ns      text[];
    v_ok      text[];
    v_missed  integer := 0;
    v_head    uuid[];
    v_want    uuid[];
    v_change  boolean;
    v_headless boolean;
    v_demoted uuid[];
BEGIN
    IF coalesce(cardinality(p_keys), 0) = 0 THEN
        RETURN 0;
    END IF;
    -- Many keys (a completion's) are joined with the tables: plan for the
    -- data at hand. One key (a producer's commit) is a few primary-key
    -- probes, whose generic plans are right and not worth planning anew.
    PERFORM set_config('plan_cache_mode', CASE WHEN cardinality(p_keys) > 1 THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);

    -- 1. Lock the keys' rows, in key order so that settlers never deadlock.
    IF p_wait THEN
        INSERT INTO outbox.keys (namespace, ordering_key)
        SELECT DISTINCT k.ns, k.ok FROM unnest(p_namespaces, p_keys) AS k(ns, ok) ORDER BY 1, 2
        ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING;
        SELECT array_agg(x.namespace ORDER BY x.namespace, x.ordering_key),
               array_agg(x.ordering_key ORDER BY x.namespace, x.ordering_key)
          INTO v_ns, v_ok
          FROM (SELECT k.namespace, k.ordering_key FROM outbox.keys k
                WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(p_namespaces, p_keys))
                ORDER BY 1, 2
                FOR UPDATE) x;
    ELSE
        SELECT array_agg(x.namespace ORDER BY x.namespace, x.ordering_key),
               array_agg(x.ordering_key ORDER BY x.namespace, x.ordering_key)
          INTO v_ns, v_ok
          FROM (SELECT k.namespace, k.ordering_key FROM outbox.keys k
                WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(p_namespaces, p_keys))
                ORDER BY 1, 2
                FOR UPDATE SKIP LOCKED) x;
        -- Keys not locked are someone else's right now: owe them a settle.
        IF coalesce(cardinality(v_ns), 0) < cardinality(p_keys) THEN
            INSERT INTO outbox.unsettled_keys (namespace, ordering_key)
            SELECT DISTINCT k.ns, k.ok FROM unnest(p_namespaces, p_keys) AS k(ns, ok)
            WHERE NOT EXISTS (SELECT 1 FROM unnest(v_ns, v_ok) AS l(ns, ok) WHERE l.ns = k.ns AND l.ok = k.ok);
            GET DIAGNOSTICS v_missed = ROW_COUNT;
        END IF;
    END IF;
    IF v_ns IS NULL THEN
        RETURN v_missed;
    END IF;

    -- 2. With the locks held, a new statement sees every committed change to
    --    these keys: find each key's head and the message that should be
    --    its head (none while the key is parked; the head itself while a
    --    claim holds it).
    SELECT array_agg(s.head ORDER BY s.i), array_agg(s.want ORDER BY s.i),
           bool_or(s.want IS DISTINCT FROM s.head), bool_or(s.want IS NULL)
      INTO v_head, v_want, v_change, v_headless
      FROM (SELECT k.i, h.id AS head,
                   CASE WHEN EXISTS (SELECT 1 FROM outbox.dead d
                                     WHERE d.namespace = k.ns AND d.ordering_key = k.ok AND d.holds_key) THEN NULL
                        WHEN h.lease_token IS NOT NULL THEN h.id
                        ELSE (SELECT p.id FROM outbox.pending p
                              WHERE p.namespace = k.ns AND p.ordering_key = k.ok
                              ORDER BY p.sequence_id LIMIT 1)
                   END AS want
            FROM unnest(v_ns, v_ok) WITH ORDINALITY AS k(ns, ok, i)
            LEFT JOIN outbox.pending h ON h.namespace = k.ns AND h.ordering_key = k.ok AND NOT h.behind) s;

    -- 3. Demote a head that should not be one (a replayed message with a
    --    lower sequence id goes first), unless a claim leased it meanwhile:
    --    then it is in flight and stays the head. Then promote the rightful
    --    head where the key has none now. Two statements, in this order, so
    --    that pending_key_head never sees two heads of one key.
    IF v_change THEN
        WITH demoted AS (
            UPDATE outbox.pending p SET behind = true
            FROM unnest(v_head, v_want) AS x(head, want)
            WHERE p.id = x.head AND x.want IS DISTINCT FROM x.head AND p.lease_token IS NULL
            RETURNING p.id
        )
        SELECT array_agg(d.id) INTO v_demoted FROM demoted d;
        UPDATE outbox.pending p SET behind = false
        FROM unnest(v_head, v_want) AS x(head, want)
        WHERE p.id = x.want AND x.want IS DISTINCT FROM x.head
          AND (x.head IS NULL OR x.head = ANY (v_demoted));
    END IF;

    -- 4. A key left without a head: mark the change for producers at
    --    REPEATABLE READ (see outbox.keys).
    IF v_headless THEN
        UPDATE outbox.keys k SET settled_at = clock_timestamp()
        FROM unnest(v_ns, v_ok, v_want) AS x(ns, ok, want)
        WHERE k.namespace = x.ns AND k.ordering_key = x.ok AND x.want IS NULL;
    END IF;
    RETURN v_missed;
END;
$$;
-- +goose StatementEnd
