-- The operator console: what is pending and why, message actions, pauses.
--
-- Pauses. An operator pauses a namespace, or one topic of it, with a
-- reason (outbox.pause); claims skip its messages until it is resumed
-- (outbox.resume), and stats() counts them as paused rather than due or
-- stuck. A paused message carries pending.paused, which keeps it out of
-- the claim index (pending_claimable), so a claim never reads it: a
-- claim's cost does not grow with work it may not take. Everyone who puts
-- a message into pending (enqueue_batch, replay_dead) marks it paused when
-- its namespace or topic is; with nothing paused that costs one probe of
-- an empty table per statement. A message keeps its mark while it is
-- claimed, retried, released or requeued, so only inserts look it up.
--
-- Message actions, each audited in the attempts archive with the operator
-- name given, the login (session_user) and a required reason:
-- outbox.retry_now (a RESCHEDULED attempt: a retrying message's next
-- attempt moved to now), outbox.purge_dead (dead letters older than a
-- window, at least a day, given up as DISCARDED). Pauses and dead-letter
-- purges are also in outbox.operator_log.
--
-- outbox.pending_messages lists pending messages for operators with what
-- each waits for; stats() also counts retrying and paused messages and
-- names each topic's most frequent error code.
--
-- SQLSTATEs added: P7005 an operator action refused for the state of what
-- it names (a message leased, delivered or dead; a namespace not paused or
-- paused already); the error names each one and why.

-- +goose Up
SET LOCAL ROLE outbox_owner;

CREATE TABLE outbox.paused (
    namespace text        NOT NULL,
    -- '*': the whole namespace (no topic can be called '*').
    topic     text        NOT NULL DEFAULT '*',
    paused_by text,
    db_user   text        NOT NULL DEFAULT session_user,
    reason    text        NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT paused_pkey PRIMARY KEY (namespace, topic)
);
COMMENT ON TABLE outbox.paused IS 'Namespaces (topic *) and topics whose messages claims skip, with who paused them (paused_by as given, db_user the login), why and when.';

-- A constant default: no rewrite of the table.
ALTER TABLE outbox.pending ADD COLUMN paused boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN outbox.pending.paused IS 'true: its namespace or topic is paused (outbox.paused); out of the claim index until resumed.';

-- The claim index without paused messages. Its statements say NOT paused
-- (claim_batch, claimable_estimate), or the planner could not use it.
DROP INDEX outbox.pending_claimable;
CREATE INDEX pending_claimable ON outbox.pending (next_attempt_at, id) WHERE lease_token IS NULL AND NOT behind AND NOT paused;
-- The paused messages, for resume (and only those: an unpaused row costs
-- the index nothing but its predicate).
CREATE INDEX pending_paused ON outbox.pending (namespace, topic) WHERE paused;

-- RESCHEDULED: an operator moved a retrying message's next attempt to now.
-- NOT VALID: the states only grow, so the rows there are valid, and
-- validating would scan the whole archive under this migration's lock.
ALTER TABLE outbox.attempts
    DROP CONSTRAINT attempts_state_valid,
    ADD CONSTRAINT attempts_state_valid
        CHECK (state IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'ZOMBIE_REQUEUE', 'REPLAYED', 'DISCARDED', 'RESCHEDULED')) NOT VALID;

-- The state machine's functions that put messages where claims look, or read
-- them, taught about pauses (and the purges about RESCHEDULED); the rest of
-- each is migration 5's, unchanged.
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
CREATE OR REPLACE FUNCTION outbox.claimable_estimate(
    p_limit      int,
    p_namespaces text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Custom plans see the LIMIT and the namespaces, as claim_batch's do.
SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off
SET jit = off
AS $$
-- What claims of p_namespaces (NULL: all) could take now, counted up to
-- p_limit: due unleased heads and unordered messages, by the claim's own
-- index (pending_claimable), then expired leases, which a claim takes over
-- first, by pending_lease_expiry. A due key counts once, by its head,
-- whatever the run behind it: one claim at a time works a key, so heads are
-- what more claimers can share; an expired lease counts each of its rows.
-- It reads at most p_limit entries of each index and no other rows (with
-- namespaces, the other namespaces' entries among them are read and
-- skipped, as the claim does). Rows that uncommitted claims hold still
-- count, paused ones do not: it is an estimate for deciding how many dispatchers to start, not
-- a promise.
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_due     bigint;
    v_expired bigint := 0;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000000 THEN
        RAISE EXCEPTION 'outbox.claimable_estimate: p_limit must be between 1 and 1000000, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    SELECT count(*) INTO v_due
    FROM (SELECT 1 FROM outbox.pending p
          WHERE p.lease_token IS NULL AND NOT p.behind AND NOT p.paused AND p.next_attempt_at <= v_now
            AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
          LIMIT p_limit) x;
    IF v_due < p_limit THEN
        SELECT count(*) INTO v_expired
        FROM (SELECT 1 FROM outbox.pending p
              WHERE p.lease_token IS NOT NULL AND p.attempt_count >= 0 AND p.lease_expires_at <= v_now AND NOT p.paused
                AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
              LIMIT p_limit - v_due) x;
    END IF;
    RETURN v_due + v_expired;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- enqueue_batch writes many messages in one statement, and is enqueue()
-- too: enqueue() is a batch of one, so that the two can never disagree on
-- validation, dedupe or sequencing. Element i of every array describes
-- message i; optional arrays may be NULL. Results come back in input order;
-- within one batch the first message with a dedupe key wins it and later
-- ones are dedupe hits, exactly as with enqueue() called in order. Every
-- message is checked against outbox.limits and the rules the Go producer
-- applies, and the whole call is refused at the first bad message with
-- SQLSTATE P7004, the field in the error's COLUMN, the message's index in
-- its DETAIL, and nothing written.
CREATE OR REPLACE FUNCTION outbox.enqueue_batch(
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
    v_n        int := coalesce(cardinality(p_namespaces), 0);
    v_now      timestamptz := now();
    v_max_payload       int;
    v_max_key           int;
    v_max_headers       int;
    v_max_header_value  int;
    v_max_delay         interval;
    v_floor    bigint;
    v_payloads jsonb[];
    v_headers  jsonb[];
    v_ids      uuid[];
    v_inserted boolean[];
    v_seqs     bigint[];
    v_problem  text[];
    v_allowed  text[];
    v_paused   boolean;
    -- Errors name the function the producer called (see enqueue()).
    v_caller   text := CASE WHEN v_n = 1 AND current_setting('outbox.enqueue_single', true) = 'on'
                            THEN 'outbox.enqueue' ELSE 'outbox.enqueue_batch' END;
    -- C0 and C1 control characters, as Go's unicode.IsControl (no NUL in text).
    c_control  constant text := '[\u0001-\u001f\u007f-\u009f]';
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_topics), 0) <> v_n OR coalesce(cardinality(p_payloads), 0) <> v_n
       OR coalesce(cardinality(p_tenant_ids), v_n) <> v_n OR coalesce(cardinality(p_dedupe_keys), v_n) <> v_n
       OR coalesce(cardinality(p_ordering_keys), v_n) <> v_n OR coalesce(cardinality(p_headers), v_n) <> v_n
       OR coalesce(cardinality(p_trace_headers), v_n) <> v_n OR coalesce(cardinality(p_available_at), v_n) <> v_n THEN
        RAISE EXCEPTION '%: every array must have one element per message (% messages)', v_caller, v_n
            USING ERRCODE = '22023';
    END IF;
    -- A batch's statements join arrays with the tables, and a generic plan
    -- made while the tables were small would keep scanning dedupe in full
    -- as it grows: plan them for the data at hand. A single message's
    -- statements are primary-key probes whose generic plans are right
    -- whatever the sizes, and planning them on every call (as auto would,
    -- generic plans of array expressions being costed high) triples the
    -- cost of an enqueue.
    PERFORM set_config('plan_cache_mode', CASE WHEN v_n > 1 THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);

    -- The limits, the message ids, and the keys as they are stored: an
    -- empty key is no key, as for the Go producer, and an array with no
    -- key at all is NULL, so that the steps for dedupe and ordering are
    -- skipped. One statement: every statement of an enqueue costs.
    SELECT (SELECT l.max_payload_bytes FROM outbox.limits l), (SELECT l.max_key_bytes FROM outbox.limits l),
           (SELECT l.max_headers FROM outbox.limits l), (SELECT l.max_header_value_bytes FROM outbox.limits l),
           (SELECT l.max_delay FROM outbox.limits l),
           -- The namespaces this login is confined to (NULL: none).
           (SELECT array_agg(g.namespace) FROM outbox.producer_namespaces g
            JOIN pg_catalog.pg_roles r ON r.rolname = g.role_name
            WHERE pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')
              AND NOT (SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname = session_user)),
           -- Whether anything is paused (see step 5).
           EXISTS (SELECT 1 FROM outbox.paused),
           array_agg(outbox.uuid_v7() ORDER BY e.i),
           CASE WHEN bool_or(nullif(e.tenant, '') IS NOT NULL) THEN array_agg(nullif(e.tenant, '') ORDER BY e.i) END,
           CASE WHEN bool_or(nullif(e.dk, '') IS NOT NULL) THEN array_agg(nullif(e.dk, '') ORDER BY e.i) END,
           CASE WHEN bool_or(nullif(e.ok, '') IS NOT NULL) THEN array_agg(nullif(e.ok, '') ORDER BY e.i) END,
           CASE WHEN bool_or(nullif(e.trace, '') IS NOT NULL) THEN array_agg(nullif(e.trace, '') ORDER BY e.i) END
      INTO v_max_payload, v_max_key, v_max_headers, v_max_header_value, v_max_delay, v_allowed, v_paused, v_ids, p_tenant_ids, p_dedupe_keys, p_ordering_keys, p_trace_headers
      FROM unnest(p_namespaces, p_tenant_ids, p_dedupe_keys, p_ordering_keys, p_trace_headers) WITH ORDINALITY
           AS e(ns, tenant, dk, ok, trace, i);

    IF v_allowed IS NOT NULL THEN
        SELECT ARRAY[x.i::text, x.ns] INTO v_problem
        FROM unnest(p_namespaces) WITH ORDINALITY AS x(ns, i)
        WHERE NOT (x.ns = ANY (v_allowed))
        ORDER BY x.i LIMIT 1;
        IF v_problem IS NOT NULL THEN
            RAISE EXCEPTION '%: login % may not enqueue into namespace %', v_caller, session_user, quote_literal(v_problem[2])
                USING ERRCODE = '42501', COLUMN = 'namespace',
                      DETAIL = format('message index: %s', CASE WHEN v_caller = 'outbox.enqueue' THEN -1 ELSE v_problem[1]::int - 1 END),
                      HINT = format('Its roles may enqueue into: %s. An operator grants more with outbox.grant_namespace(role, namespace).',
                                    array_to_string(v_allowed, ', '));
        END IF;
        v_problem := NULL;
    END IF;

    -- Every check, and the parse of payloads and headers for the insert, in
    -- one pass; the first message at fault is named. A payload is parsed
    -- only once it is known not to be over the limit. The name patterns are
    -- unbounded with a separate length check: PostgreSQL's regular
    -- expressions are ten times slower with {0,127}. A document PostgreSQL
    -- cannot store (bad syntax, \u0000, a lone surrogate, a number beyond
    -- numeric) fails the parse; the handler finds which. The block only
    -- reads, so its subtransaction takes no transaction id.
    BEGIN
        SELECT ARRAY[(array_agg(x.i::text ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1],
                     (array_agg(x.problem[1] ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1],
                     (array_agg(x.problem[2] ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1]],
               array_agg(x.pj ORDER BY x.i), array_agg(x.hj ORDER BY x.i)
          INTO v_problem, v_payloads, v_headers
          FROM (
            SELECT e.i, c.pj, c.hj, CASE
                WHEN e.ns IS NULL OR e.ns = '' THEN ARRAY['namespace', 'must not be empty']
                WHEN octet_length(e.ns) > 128 OR e.ns !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' THEN
                    ARRAY['namespace', format('%s must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit', quote_literal(left(e.ns, 140)))]
                WHEN e.tp IS NULL OR e.tp = '' THEN ARRAY['topic', 'must not be empty']
                WHEN octet_length(e.tp) > 128 OR e.tp !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' THEN
                    ARRAY['topic', format('%s must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit', quote_literal(left(e.tp, 140)))]
                WHEN e.payload IS NULL OR e.payload = '' THEN ARRAY['payload', 'must not be empty']
                WHEN octet_length(e.payload) > v_max_payload THEN
                    ARRAY['payload', format('is %s bytes, over the limit of %s', octet_length(e.payload), v_max_payload)]
                WHEN jsonb_typeof(c.pj) NOT IN ('object', 'array') THEN
                    ARRAY['payload', 'must be a JSON object or array, not a ' || jsonb_typeof(c.pj)]
                WHEN octet_length(e.tenant) > v_max_key THEN
                    ARRAY['tenant_id', format('is %s bytes, over the limit of %s', octet_length(e.tenant), v_max_key)]
                WHEN e.tenant ~ c_control THEN ARRAY['tenant_id', 'contains a control character']
                WHEN octet_length(e.dk) > v_max_key THEN
                    ARRAY['dedupe_key', format('is %s bytes, over the limit of %s', octet_length(e.dk), v_max_key)]
                WHEN e.dk ~ c_control THEN ARRAY['dedupe_key', 'contains a control character']
                WHEN octet_length(e.ok) > v_max_key THEN
                    ARRAY['ordering_key', format('is %s bytes, over the limit of %s', octet_length(e.ok), v_max_key)]
                WHEN e.ok ~ c_control THEN ARRAY['ordering_key', 'contains a control character']
                WHEN octet_length(e.trace) > 256 THEN ARRAY['trace_header', format('is %s bytes, over the limit of 256', octet_length(e.trace))]
                WHEN e.trace !~ '^[!-~]*$' THEN ARRAY['trace_header', 'must be printable ASCII without spaces']
                WHEN NOT isfinite(e.at) THEN ARRAY['available_at', format('must be a finite time, got %s', e.at)]
                -- The clock now, not the transaction's start: a producer's
                -- own check of the same bound, made just before, must not be
                -- looser.
                WHEN e.at > clock_timestamp() + v_max_delay THEN
                    ARRAY['available_at', format('is more than %s ahead (%s); the limit is outbox.limits.max_delay', v_max_delay, e.at)]
                WHEN octet_length(e.headers) > 1048576 THEN ARRAY['headers', 'are over 1 MiB of JSON']
                WHEN c.hj IS NULL OR c.hj = '{}'::jsonb THEN NULL
                WHEN jsonb_typeof(c.hj) <> 'object' THEN ARRAY['headers', 'must be a JSON object of strings']
                WHEN (SELECT count(*) FROM jsonb_object_keys(c.hj)) > v_max_headers THEN
                    ARRAY['headers', format('has %s entries, more than the limit of %s',
                                            (SELECT count(*) FROM jsonb_object_keys(c.hj)), v_max_headers)]
                ELSE (SELECT ARRAY['headers', h.problem]
                      FROM (SELECT kv.key, CASE
                                WHEN octet_length(kv.key) > 64 OR kv.key !~ '^[A-Za-z0-9][A-Za-z0-9_.-]*$' THEN
                                    format('name %s must be 1-64 characters of letters, digits and _ . -, starting with a letter or digit', quote_ident(left(kv.key, 80)))
                                WHEN lower(kv.key) LIKE ANY (ARRAY['outbox%', 'webhook-%', 'aws.%', 'amazon.%', 'x-amz%'])
                                     OR lower(kv.key) IN ('content-type', 'content-length', 'host', 'idempotency-key',
                                                          'user-agent', 'connection', 'transfer-encoding') THEN
                                    format('name %s is reserved for the dispatcher', quote_ident(kv.key))
                                WHEN jsonb_typeof(kv.value) <> 'string' THEN
                                    format('value of %s must be a string, got %s', quote_ident(kv.key), jsonb_typeof(kv.value))
                                WHEN octet_length(kv.value #>> '{}') > v_max_header_value THEN
                                    format('value of %s is %s bytes, over the limit of %s', quote_ident(kv.key),
                                           octet_length(kv.value #>> '{}'), v_max_header_value)
                                WHEN (kv.value #>> '{}') ~ c_control THEN
                                    format('value of %s contains a control character', quote_ident(kv.key))
                            END AS problem
                            FROM jsonb_each(c.hj) kv) h
                      WHERE h.problem IS NOT NULL
                      ORDER BY h.key
                      LIMIT 1)
            END AS problem
            FROM unnest(p_namespaces, p_topics, p_payloads, p_tenant_ids, p_dedupe_keys, p_ordering_keys,
                        p_trace_headers, p_available_at, p_headers) WITH ORDINALITY
                 AS e(ns, tp, payload, tenant, dk, ok, trace, at, headers, i)
            CROSS JOIN LATERAL (
                SELECT CASE WHEN octet_length(e.payload) BETWEEN 1 AND v_max_payload THEN e.payload::jsonb END AS pj,
                       CASE WHEN octet_length(e.headers) <= 1048576 THEN e.headers::jsonb END AS hj) c
          ) x;
    EXCEPTION WHEN data_exception THEN
        FOR i IN 1 .. v_n LOOP
            BEGIN
                PERFORM CASE WHEN octet_length(p_payloads[i]) <= v_max_payload THEN p_payloads[i]::jsonb END;
            EXCEPTION WHEN data_exception THEN
                v_problem := ARRAY[i::text, 'payload', 'is not valid JSON: ' || SQLERRM];
                EXIT;
            END;
            BEGIN
                PERFORM CASE WHEN octet_length(p_headers[i]) <= 1048576 THEN p_headers[i]::jsonb END;
            EXCEPTION WHEN data_exception THEN
                v_problem := ARRAY[i::text, 'headers', 'are not valid JSON: ' || SQLERRM];
                EXIT;
            END;
        END LOOP;
        IF v_problem[1] IS NULL THEN
            RAISE;
        END IF;
    END;

    IF v_problem[1] IS NOT NULL THEN
        -- DETAIL carries the message's index in the batch, for callers.
        IF v_caller = 'outbox.enqueue' THEN
            RAISE EXCEPTION '%: invalid message: % %', v_caller, v_problem[2], v_problem[3]
                USING ERRCODE = 'P7004', COLUMN = v_problem[2], DETAIL = 'message index: -1';
        END IF;
        RAISE EXCEPTION '%: invalid message %: % %', v_caller, v_problem[1]::int - 1, v_problem[2], v_problem[3]
            USING ERRCODE = 'P7004', COLUMN = v_problem[2], DETAIL = format('message index: %s', v_problem[1]::int - 1);
    END IF;

    -- 3. Claim the dedupe keys, in key order; the lowest position wins a key
    --    repeated within the batch. Concurrent batches sharing keys lock them
    --    in the same order, so they cannot deadlock.
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

    -- 4. Sequence ids for the inserted messages with an ordering key: each
    --    key's allocator moves once by its count, in key order. The row lock
    --    it takes serialises the key's producers until commit, so sequence
    --    order is commit order.
    IF p_ordering_keys IS NOT NULL THEN
        SELECT f.last_sequence_id INTO v_floor FROM outbox.sequence_floor f;
        WITH e AS (
            SELECT x.ns, x.ok, x.ord, row_number() OVER (PARTITION BY x.ns, x.ok ORDER BY x.ord) AS rank
            FROM unnest(p_namespaces, p_ordering_keys, v_inserted) WITH ORDINALITY AS x(ns, ok, ins, ord)
            WHERE x.ok IS NOT NULL AND x.ins
        ),
        counts AS (
            SELECT e.ns, e.ok, count(*) AS n FROM e GROUP BY e.ns, e.ok
        ),
        bumped AS (
            INSERT INTO outbox.sequences AS s (namespace, ordering_key, last_sequence_id)
            SELECT c.ns, c.ok, v_floor + c.n FROM counts c ORDER BY c.ns, c.ok
            ON CONFLICT ON CONSTRAINT sequences_pkey
                DO UPDATE SET last_sequence_id = s.last_sequence_id + (excluded.last_sequence_id - v_floor),
                              updated_at = now()
            RETURNING s.namespace, s.ordering_key, s.last_sequence_id
        )
        SELECT array_agg(CASE WHEN e.ok IS NULL THEN NULL ELSE b.last_sequence_id - c.n + e.rank END ORDER BY g.ord)
        INTO v_seqs
        FROM generate_series(1, v_n) AS g(ord)
        LEFT JOIN e ON e.ord = g.ord
        LEFT JOIN counts c ON c.ns = e.ns AND c.ok = e.ok
        LEFT JOIN bumped b ON b.namespace = e.ns AND b.ordering_key = e.ok;

        IF p_dedupe_keys IS NOT NULL THEN
            UPDATE outbox.dedupe d SET sequence_id = x.seq
            FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_seqs, v_inserted) AS x(ns, tp, dk, seq, ins)
            WHERE x.ins AND x.dk IS NOT NULL AND x.seq IS NOT NULL
              AND (d.namespace, d.topic, d.dedupe_key) = (x.ns, x.tp, x.dk);
        END IF;
    END IF;

    -- 5. The messages themselves. An ordered message starts behind; its
    --    key is settled when this transaction commits (the trigger on
    --    outbox.sequences), which makes it the head if it is first in line.
    --    A message of a paused namespace or topic is paused from the start,
    --    out of the claim index; with nothing paused, no pause is looked up.
    INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                payload, payload_bytes, headers, trace_header, available_at, next_attempt_at, behind,
                                paused)
    SELECT x.id, x.ns, x.tp, x.tenant, x.dk, x.ok, x.seq, x.payload, octet_length(x.payload_text),
           coalesce(x.headers, '{}'::jsonb), x.trace,
           greatest(coalesce(x.at, v_now), v_now), greatest(coalesce(x.at, v_now), v_now), x.ok IS NOT NULL,
           v_paused AND EXISTS (SELECT 1 FROM outbox.paused z WHERE z.namespace = x.ns AND z.topic IN (x.tp, '*'))
    FROM unnest(v_ids, p_namespaces, p_topics, p_tenant_ids, p_dedupe_keys, p_ordering_keys, v_seqs,
                v_payloads, p_payloads, v_headers, p_trace_headers, p_available_at, v_inserted)
         AS x(id, ns, tp, tenant, dk, ok, seq, payload, payload_text, headers, trace, at, ins)
    WHERE x.ins;

    -- 6. One row per message, in order; a dedupe hit answers with the
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.purge(
    p_attempts_older_than interval,
    p_dedupe_older_than   interval,
    p_max_rows            int,
    p_keys_older_than     interval DEFAULT NULL)
RETURNS TABLE(purged_attempts bigint, purged_dedupe bigint, purged_keys bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- A batch's per-row probes make its plans' costs look huge; compiling them
-- (350 ms for the dedupe purge of 10,000 rows) costs more than running them.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_attempts bigint := 0;
    v_dedupe   bigint := 0;
    v_keys     bigint := 0;
    v_floor    bigint;
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    -- The archive is the audit trail, and a dedupe key the only guard
    -- against a producer's retry enqueueing twice: whoever calls this may
    -- not shorten them below an hour, as the reaper's own settings may not.
    IF p_attempts_older_than < interval '1 hour' OR p_dedupe_older_than < interval '1 hour'
       OR p_keys_older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'outbox.purge: retention must be at least 1 hour (or NULL to keep), got attempts %, dedupe %, keys %',
            p_attempts_older_than, p_dedupe_older_than, p_keys_older_than USING ERRCODE = '22023';
    END IF;
    -- One retention pass at a time (purge_audit included): a pass locks the
    -- dedupe keys whose outcomes it moves before the archive rows it
    -- deletes, then the keys it deletes, and two passes of different
    -- retentions would take them in orders that can deadlock.
    PERFORM pg_advisory_xact_lock(hashtext('outbox'), hashtext('purge'));

    -- A NULL interval leaves that table alone. The history of a message
    -- that is still pending or dead is kept whatever its age: it is what an
    -- operator reads when deciding what to do with it. Operators' own
    -- actions (REPLAYED, DISCARDED, RESCHEDULED) are not the dispatcher's to erase: only
    -- outbox.purge_audit, an operator's, deletes them. A delivery's time
    -- survives its row in the key it still guards (see forget_attempts).
    --
    -- A batch costs the rows it reads: each check is a primary key probe
    -- (OFFSET 0 keeps the planner from hashing all of pending or dead for
    -- an anti-join), and the keys are deleted by their ctids.
    IF p_attempts_older_than IS NOT NULL THEN
        v_attempts := outbox.forget_attempts(ARRAY(
            SELECT o.id FROM outbox.attempts o
            WHERE o.created_at < now() - p_attempts_older_than
              AND o.state NOT IN ('REPLAYED', 'DISCARDED', 'RESCHEDULED')
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
            LIMIT p_max_rows));
    END IF;

    -- A dedupe key outlives its message by the retention window, counted
    -- from the message's terminal outcome (delivered or discarded), never
    -- from its enqueue: a message that waited longer than the window (its
    -- retries, AvailableAt, an outage) keeps its key for the whole window
    -- after it went. While the message is pending or dead, its key stays,
    -- and so does a key whose outcome is known nowhere (the archive has no
    -- terminal row and the key no settled_at: only a hand edit does that).
    -- The key's own age is a cheap first filter, since no message goes
    -- before it is enqueued.
    IF p_dedupe_older_than IS NOT NULL THEN
        DELETE FROM outbox.dedupe x
        WHERE x.ctid = ANY (ARRAY(
            SELECT k.ctid FROM outbox.dedupe k
            WHERE k.created_at < now() - p_dedupe_older_than
              -- The latest outcome known, in the key or in the archive
              -- (greatest ignores a NULL; two NULLs keep the key).
              AND greatest(k.settled_at,
                           (SELECT max(a.created_at) FROM outbox.attempts a
                            WHERE a.message_id = k.message_id AND a.state IN ('DISPATCHED', 'DISCARDED')))
                  < now() - p_dedupe_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = k.message_id OFFSET 0)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = k.message_id OFFSET 0)
            LIMIT p_max_rows));
        GET DIAGNOSTICS v_dedupe = ROW_COUNT;
    END IF;

    -- A key with nothing pending or dead, idle for the retention window,
    -- loses its bookkeeping (sequence allocator and key row). Its sequence
    -- ids must never go back if it comes back, so a key is forgotten only
    -- once outbox.sequence_floor (which new keys start above) covers it, and
    -- the floor is raised in an earlier pass than the one that forgets: a
    -- producer that read the old floor has committed or failed by then.
    IF p_keys_older_than IS NOT NULL THEN
        SELECT f.last_sequence_id INTO v_floor FROM outbox.sequence_floor f;
        WITH idle AS (
            SELECT s.namespace, s.ordering_key, s.last_sequence_id
            FROM outbox.sequences s
            WHERE s.updated_at < now() - p_keys_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p
                              WHERE p.namespace = s.namespace AND p.ordering_key = s.ordering_key)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d
                              WHERE d.namespace = s.namespace AND d.ordering_key = s.ordering_key)
              AND NOT EXISTS (SELECT 1 FROM outbox.unsettled_keys u
                              WHERE u.namespace = s.namespace AND u.ordering_key = s.ordering_key)
            ORDER BY s.updated_at
            LIMIT p_max_rows
            -- A producer enqueueing to the key right now holds its row.
            FOR UPDATE OF s SKIP LOCKED
        ),
        -- And whoever is settling it right now holds its key row.
        unlocked AS (
            SELECT k.namespace, k.ordering_key FROM outbox.keys k JOIN idle i USING (namespace, ordering_key)
            FOR UPDATE OF k SKIP LOCKED
        ),
        forgotten AS (
            DELETE FROM outbox.sequences s
            USING idle i
            WHERE s.namespace = i.namespace AND s.ordering_key = i.ordering_key AND i.last_sequence_id <= v_floor
              AND (EXISTS (SELECT 1 FROM unlocked u WHERE u.namespace = i.namespace AND u.ordering_key = i.ordering_key)
                   OR NOT EXISTS (SELECT 1 FROM outbox.keys k WHERE k.namespace = i.namespace AND k.ordering_key = i.ordering_key))
            RETURNING s.namespace, s.ordering_key
        ),
        unkeyed AS (
            DELETE FROM outbox.keys k USING forgotten f
            WHERE k.namespace = f.namespace AND k.ordering_key = f.ordering_key
        ),
        raised AS (
            UPDATE outbox.sequence_floor f
            SET last_sequence_id = (SELECT max(i.last_sequence_id) FROM idle i)
            WHERE (SELECT max(i.last_sequence_id) FROM idle i) > f.last_sequence_id
        )
        SELECT count(*) INTO v_keys FROM forgotten;
    END IF;

    RETURN QUERY SELECT v_attempts, v_dedupe, v_keys;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.purge_audit(
    p_older_than interval,
    p_max_rows   int,
    p_operator   text DEFAULT NULL,
    p_reason     text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Operators' actions in the archive (REPLAYED, DISCARDED, RESCHEDULED) older than
-- p_older_than, of messages no longer pending or dead: the audit trail,
-- which outbox.purge leaves alone and only an operator may shorten. The
-- purge itself is recorded in outbox.operator_log, which nothing shortens.
DECLARE
    v_n bigint;
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '1 day' THEN
        RAISE EXCEPTION 'outbox.purge_audit: the audit trail is kept at least 1 day, got %', p_older_than
            USING ERRCODE = '22023';
    END IF;
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge_audit: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    -- One retention pass at a time: see outbox.purge.
    PERFORM pg_advisory_xact_lock(hashtext('outbox'), hashtext('purge'));
    v_n := outbox.forget_attempts(ARRAY(
        SELECT o.id FROM outbox.attempts o
        WHERE o.created_at < now() - p_older_than
          AND o.state IN ('REPLAYED', 'DISCARDED', 'RESCHEDULED')
          AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
          AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
        LIMIT p_max_rows));
    PERFORM outbox.record_operator_action('purge_audit', 'outbox.attempts', p_operator, p_reason,
        jsonb_build_object('older_than', p_older_than::text, 'max_rows', p_max_rows, 'purged', v_n));
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- is_paused is whether a (namespace, topic) is paused now, by the
-- table rather than the mark: what counts as paused for stats() and the
-- listings even for a message that missed its mark. Not executable by any
-- runtime role.
CREATE FUNCTION outbox.is_paused(p_namespace text, p_topic text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM outbox.paused z WHERE z.namespace = p_namespace AND z.topic IN (p_topic, '*'))
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.pause(
    p_namespace text,
    p_topic     text DEFAULT NULL,
    p_operator  text DEFAULT NULL,
    p_reason    text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Pauses a namespace (p_topic NULL or '*') or one topic of it: claims skip
-- its messages until outbox.resume. Returns how many pending messages it
-- marked paused. A message being delivered right now is marked too and
-- finishes its attempt; if it is retried, it waits for the resume.
--
-- Marking never waits: a message that a claim or completion holds at this
-- moment is left unmarked, as is one whose producer commits just after
-- the pause. Claims skip such a message all the same when it is unordered
-- or its key's head (they check the pause while anything is paused; one
-- behind a head of another, unpaused topic could still go in that head's
-- run), and the next resume of a topic of the namespace, or a pause
-- after it, marks it; until then a claim reads it without taking it.
-- The marked messages' former entries in the claim index stay until
-- vacuum removes them (autovacuum, within seconds with the settings the
-- README recommends): until then claims step over them, the first marking
-- them dead for those that follow.
DECLARE
    v_topic    text := coalesce(nullif(p_topic, ''), '*');
    v_existing outbox.paused;
    v_marked   bigint;
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'outbox.pause: a reason is required; it is kept in outbox.paused and outbox.operator_log'
            USING ERRCODE = '22023';
    END IF;
    IF p_namespace IS NULL OR octet_length(p_namespace) > 128 OR p_namespace !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' THEN
        RAISE EXCEPTION 'outbox.pause: % is not a namespace (1-128 characters of letters, digits and . _ : / -, starting with a letter or digit)',
            coalesce(quote_literal(p_namespace), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF v_topic <> '*' AND (octet_length(v_topic) > 128 OR v_topic !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$') THEN
        RAISE EXCEPTION 'outbox.pause: % is not a topic (1-128 characters of letters, digits and . _ : / -, starting with a letter or digit; NULL or * for the whole namespace)',
            quote_literal(v_topic) USING ERRCODE = '22023';
    END IF;
    -- The same pause twice keeps its first author and reason, and is
    -- refused: the operator may be about to overwrite someone else's.
    SELECT z.* INTO v_existing FROM outbox.paused z
    WHERE z.namespace = p_namespace AND z.topic IN (v_topic, '*')
    ORDER BY z.topic = '*' DESC LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outbox.pause: %/% is already paused%, by % (login %) since %: %',
            p_namespace, v_existing.topic, CASE WHEN v_existing.topic <> v_topic THEN ' as a whole' ELSE '' END,
            coalesce(v_existing.paused_by, v_existing.db_user), v_existing.db_user, v_existing.paused_at, v_existing.reason
            USING ERRCODE = 'P7005', HINT = 'Resume it first to pause it again with another reason.';
    END IF;
    INSERT INTO outbox.paused (namespace, topic, paused_by, reason)
    VALUES (p_namespace, v_topic, nullif(p_operator, ''), p_reason);

    v_marked := outbox.mark_paused(p_namespace, v_topic);
    PERFORM outbox.record_operator_action('pause', p_namespace || '/' || v_topic, p_operator, p_reason,
        jsonb_build_object('namespace', p_namespace, 'topic', v_topic, 'messages', v_marked));
    RETURN v_marked;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- mark_paused marks the pending messages of a paused namespace or topic
-- that are not marked yet, skipping those someone holds (see outbox.pause).
-- Not executable by any runtime role.
CREATE FUNCTION outbox.mark_paused(p_namespace text, p_topic text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    v_n bigint;
BEGIN
    UPDATE outbox.pending p SET paused = true
    WHERE p.ctid = ANY (ARRAY(
        SELECT q.ctid FROM outbox.pending q
        WHERE q.namespace = p_namespace AND (p_topic = '*' OR q.topic = p_topic) AND NOT q.paused
        FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.resume(
    p_namespace text,
    p_topic     text DEFAULT NULL,
    p_operator  text DEFAULT NULL,
    p_reason    text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Ends a pause that outbox.pause made (the same namespace and topic):
-- its messages are claimable again, in their old order. Returns how many
-- pending messages it unmarked. A message still covered by another pause
-- (its topic paused on its own) stays paused. Recorded in
-- outbox.operator_log with who had paused it, when and why.
DECLARE
    v_topic  text := coalesce(nullif(p_topic, ''), '*');
    v_pause  outbox.paused;
    v_others text;
    v_n      bigint;
    v_round  bigint;
    v_deadline timestamptz := clock_timestamp() + interval '10 seconds';
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'outbox.resume: a reason is required; it is kept in outbox.operator_log'
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM outbox.paused z WHERE z.namespace = p_namespace AND z.topic = v_topic
    RETURNING z.* INTO v_pause;
    IF NOT FOUND THEN
        SELECT string_agg(z.namespace || '/' || z.topic, ', ' ORDER BY z.namespace, z.topic) INTO v_others
        FROM outbox.paused z WHERE z.namespace = p_namespace;
        RAISE EXCEPTION 'outbox.resume: %/% is not paused%', coalesce(p_namespace, 'NULL'), v_topic,
            CASE WHEN v_others IS NULL THEN '' ELSE '; paused there: ' || v_others END
            USING ERRCODE = 'P7005',
                  HINT = CASE WHEN v_others LIKE '%/*%' THEN 'The namespace is paused as a whole: resume it without a topic.'
                              ELSE 'outbox.pauses() lists what is paused.' END;
    END IF;

    -- Every marked message must be unmarked, or it would stay out of the
    -- claim index for good. Rows someone holds (a completion settling a
    -- key holds them for milliseconds) are taken in a later round rather
    -- than waited for: a resume waiting on a row while holding others
    -- could deadlock with that completion, and the completion might be
    -- the one PostgreSQL aborts.
    v_n := 0;
    LOOP
        UPDATE outbox.pending p SET paused = false
        WHERE p.ctid = ANY (ARRAY(
            SELECT q.ctid FROM outbox.pending q
            WHERE q.paused AND q.namespace = p_namespace AND (v_topic = '*' OR q.topic = v_topic)
              AND NOT outbox.is_paused(q.namespace, q.topic)
            FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS v_round = ROW_COUNT;
        v_n := v_n + v_round;
        EXIT WHEN NOT EXISTS (SELECT 1 FROM outbox.pending q
                              WHERE q.paused AND q.namespace = p_namespace AND (v_topic = '*' OR q.topic = v_topic)
                                AND NOT outbox.is_paused(q.namespace, q.topic));
        IF clock_timestamp() > v_deadline THEN
            RAISE EXCEPTION 'outbox.resume: messages of %/% stayed locked for 10 seconds; nothing was resumed', p_namespace, v_topic
                USING ERRCODE = '55P03', HINT = 'Try again: dispatchers hold a message only while claiming or completing it.';
        END IF;
        PERFORM pg_sleep(0.01);
    END LOOP;
    -- And what a pause still in force missed, marked now.
    IF v_topic = '*' THEN
        PERFORM outbox.mark_paused(z.namespace, z.topic) FROM outbox.paused z WHERE z.namespace = p_namespace;
    END IF;

    PERFORM outbox.record_operator_action('resume', p_namespace || '/' || v_topic, p_operator, p_reason,
        jsonb_build_object('namespace', p_namespace, 'topic', v_topic, 'messages', v_n,
                           'paused_by', v_pause.paused_by, 'paused_db_user', v_pause.db_user,
                           'paused_at', v_pause.paused_at, 'paused_reason', v_pause.reason));
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.pauses()
RETURNS TABLE(namespace text, topic text, paused_by text, db_user text, reason text, paused_at timestamptz,
              messages bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- What is paused, by whom and why, and how many pending messages each
    -- pause holds (through pending_paused: it reads only paused messages).
    SELECT z.namespace, z.topic, z.paused_by, z.db_user, z.reason, z.paused_at,
           (SELECT count(*) FROM outbox.pending p
            WHERE p.paused AND p.namespace = z.namespace AND (z.topic = '*' OR p.topic = z.topic))
    FROM outbox.paused z
    ORDER BY z.paused_at, z.namespace, z.topic
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.pending_messages(
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

-- +goose StatementBegin
-- pending_state names where a pending message stands, as
-- pending_messages() says it. Not executable by any runtime role.
CREATE FUNCTION outbox.pending_state(p_lease_token uuid, p_lease_expires_at timestamptz, p_paused boolean,
                                     p_behind boolean, p_next_attempt_at timestamptz, p_last_error_code text,
                                     p_now timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN p_lease_token IS NOT NULL AND p_lease_expires_at <= p_now THEN 'lease_expired'
        WHEN p_lease_token IS NOT NULL THEN 'leased'
        WHEN p_paused THEN 'paused'
        WHEN p_behind THEN 'behind'
        WHEN p_next_attempt_at > p_now AND p_last_error_code IS NOT NULL THEN 'retrying'
        WHEN p_next_attempt_at > p_now THEN 'scheduled'
        ELSE 'due'
    END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.retry_now(
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
-- reason. All or nothing: a message that is not pending (delivered,
-- discarded, dead, unknown), is leased, is held by a claim or completion
-- right now, or has never failed (its producer scheduled it) refuses the
-- whole call, SQLSTATE P7005, naming each. A paused message is rescheduled
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
          WHERE p.id = ANY (p_message_ids) AND p.lease_token IS NULL AND p.last_error_code IS NOT NULL
          FOR UPDATE SKIP LOCKED) l;

    SELECT string_agg(format('%s %s', u.id, CASE
               WHEN p.id IS NULL AND d.id IS NOT NULL THEN 'is a dead letter: replay it instead'
               WHEN p.id IS NULL THEN 'is not pending (delivered, discarded, or never enqueued)'
               WHEN p.lease_token IS NOT NULL THEN format('is leased by %s until %s', p.claimed_by, p.lease_expires_at)
               WHEN p.last_error_code IS NULL THEN format('has not failed: its producer scheduled it for %s', p.next_attempt_at)
               ELSE 'is being claimed or completed right now: try again'
           END), '; ' ORDER BY u.ord)
      INTO v_problems
      FROM (SELECT DISTINCT ON (x.id) x.id, x.ord FROM unnest(p_message_ids) WITH ORDINALITY AS x(id, ord) ORDER BY x.id, x.ord) u
      LEFT JOIN outbox.pending p ON p.id = u.id
      LEFT JOIN outbox.dead d ON d.id = u.id
      WHERE NOT (u.id = ANY (coalesce(v_ids, '{}')));
    IF v_problems IS NOT NULL THEN
        RAISE EXCEPTION 'outbox.retry_now: nothing rescheduled: %', v_problems
            USING ERRCODE = 'P7005', HINT = 'Only a pending message that failed and is not leased can be retried now.';
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.purge_dead(
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
-- +goose StatementEnd

DROP FUNCTION outbox.stats();
-- +goose StatementBegin
CREATE FUNCTION outbox.stats()
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

-- Closed to PUBLIC by the owner's default privileges; granted as the
-- matrix in privileges_test.go says.
GRANT EXECUTE ON FUNCTION outbox.stats() TO outbox_dispatcher, outbox_operator, outbox_reader;
GRANT EXECUTE ON FUNCTION outbox.pauses() TO outbox_dispatcher, outbox_operator, outbox_reader;
GRANT EXECUTE ON FUNCTION
    outbox.pending_messages(text, text, text, boolean, boolean, interval, int, uuid[])
TO outbox_operator, outbox_reader;
GRANT EXECUTE ON FUNCTION
    outbox.retry_now(uuid[], text, text),
    outbox.purge_dead(interval, int, text, text, text, text),
    outbox.pause(text, text, text, text),
    outbox.resume(text, text, text, text)
TO outbox_operator;
REVOKE ALL ON outbox.paused FROM PUBLIC;
GRANT SELECT ON outbox.paused TO outbox_operator, outbox_reader;

-- +goose Down
SET LOCAL ROLE outbox_owner;
-- Messages paused now become claimable: the pause goes with its table.
DROP FUNCTION outbox.pause(text, text, text, text);
DROP FUNCTION outbox.resume(text, text, text, text);
DROP FUNCTION outbox.mark_paused(text, text);
DROP FUNCTION outbox.pauses();
DROP FUNCTION outbox.pending_messages(text, text, text, boolean, boolean, interval, int, uuid[]);
DROP FUNCTION outbox.pending_state(uuid, timestamptz, boolean, boolean, timestamptz, text, timestamptz);
DROP FUNCTION outbox.retry_now(uuid[], text, text);
DROP FUNCTION outbox.purge_dead(interval, int, text, text, text, text);
DROP FUNCTION outbox.stats();
-- Migration 5's versions, verbatim.
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
-- order, stopping at the first that is not due, leased or lockable), all
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
          AND p.next_attempt_at <= v_now
          AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
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
                           count(*) FILTER (WHERE q.lease_token IS NOT NULL OR q.next_attempt_at > v_now) OVER w AS misses
                    FROM (SELECT q.id, q.ctid, q.sequence_id, q.payload_bytes, q.lease_token, q.next_attempt_at
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
CREATE OR REPLACE FUNCTION outbox.claimable_estimate(
    p_limit      int,
    p_namespaces text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Custom plans see the LIMIT and the namespaces, as claim_batch's do.
SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off
SET jit = off
AS $$
-- What claims of p_namespaces (NULL: all) could take now, counted up to
-- p_limit: due unleased heads and unordered messages, by the claim's own
-- index (pending_claimable), then expired leases, which a claim takes over
-- first, by pending_lease_expiry. A due key counts once, by its head,
-- whatever the run behind it: one claim at a time works a key, so heads are
-- what more claimers can share; an expired lease counts each of its rows.
-- It reads at most p_limit entries of each index and no other rows (with
-- namespaces, the other namespaces' entries among them are read and
-- skipped, as the claim does). Rows that uncommitted claims hold still
-- count: it is an estimate for deciding how many dispatchers to start, not
-- a promise.
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_due     bigint;
    v_expired bigint := 0;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000000 THEN
        RAISE EXCEPTION 'outbox.claimable_estimate: p_limit must be between 1 and 1000000, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    SELECT count(*) INTO v_due
    FROM (SELECT 1 FROM outbox.pending p
          WHERE p.lease_token IS NULL AND NOT p.behind AND p.next_attempt_at <= v_now
            AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
          LIMIT p_limit) x;
    IF v_due < p_limit THEN
        SELECT count(*) INTO v_expired
        FROM (SELECT 1 FROM outbox.pending p
              WHERE p.lease_token IS NOT NULL AND p.attempt_count >= 0 AND p.lease_expires_at <= v_now
                AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
              LIMIT p_limit - v_due) x;
    END IF;
    RETURN v_due + v_expired;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- enqueue_batch writes many messages in one statement, and is enqueue()
-- too: enqueue() is a batch of one, so that the two can never disagree on
-- validation, dedupe or sequencing. Element i of every array describes
-- message i; optional arrays may be NULL. Results come back in input order;
-- within one batch the first message with a dedupe key wins it and later
-- ones are dedupe hits, exactly as with enqueue() called in order. Every
-- message is checked against outbox.limits and the rules the Go producer
-- applies, and the whole call is refused at the first bad message with
-- SQLSTATE P7004, the field in the error's COLUMN, the message's index in
-- its DETAIL, and nothing written.
CREATE OR REPLACE FUNCTION outbox.enqueue_batch(
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
    v_n        int := coalesce(cardinality(p_namespaces), 0);
    v_now      timestamptz := now();
    v_max_payload       int;
    v_max_key           int;
    v_max_headers       int;
    v_max_header_value  int;
    v_max_delay         interval;
    v_floor    bigint;
    v_payloads jsonb[];
    v_headers  jsonb[];
    v_ids      uuid[];
    v_inserted boolean[];
    v_seqs     bigint[];
    v_problem  text[];
    v_allowed  text[];
    -- Errors name the function the producer called (see enqueue()).
    v_caller   text := CASE WHEN v_n = 1 AND current_setting('outbox.enqueue_single', true) = 'on'
                            THEN 'outbox.enqueue' ELSE 'outbox.enqueue_batch' END;
    -- C0 and C1 control characters, as Go's unicode.IsControl (no NUL in text).
    c_control  constant text := '[\u0001-\u001f\u007f-\u009f]';
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_topics), 0) <> v_n OR coalesce(cardinality(p_payloads), 0) <> v_n
       OR coalesce(cardinality(p_tenant_ids), v_n) <> v_n OR coalesce(cardinality(p_dedupe_keys), v_n) <> v_n
       OR coalesce(cardinality(p_ordering_keys), v_n) <> v_n OR coalesce(cardinality(p_headers), v_n) <> v_n
       OR coalesce(cardinality(p_trace_headers), v_n) <> v_n OR coalesce(cardinality(p_available_at), v_n) <> v_n THEN
        RAISE EXCEPTION '%: every array must have one element per message (% messages)', v_caller, v_n
            USING ERRCODE = '22023';
    END IF;
    -- A batch's statements join arrays with the tables, and a generic plan
    -- made while the tables were small would keep scanning dedupe in full
    -- as it grows: plan them for the data at hand. A single message's
    -- statements are primary-key probes whose generic plans are right
    -- whatever the sizes, and planning them on every call (as auto would,
    -- generic plans of array expressions being costed high) triples the
    -- cost of an enqueue.
    PERFORM set_config('plan_cache_mode', CASE WHEN v_n > 1 THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);

    -- The limits, the message ids, and the keys as they are stored: an
    -- empty key is no key, as for the Go producer, and an array with no
    -- key at all is NULL, so that the steps for dedupe and ordering are
    -- skipped. One statement: every statement of an enqueue costs.
    SELECT (SELECT l.max_payload_bytes FROM outbox.limits l), (SELECT l.max_key_bytes FROM outbox.limits l),
           (SELECT l.max_headers FROM outbox.limits l), (SELECT l.max_header_value_bytes FROM outbox.limits l),
           (SELECT l.max_delay FROM outbox.limits l),
           -- The namespaces this login is confined to (NULL: none).
           (SELECT array_agg(g.namespace) FROM outbox.producer_namespaces g
            JOIN pg_catalog.pg_roles r ON r.rolname = g.role_name
            WHERE pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')
              AND NOT (SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname = session_user)),
           array_agg(outbox.uuid_v7() ORDER BY e.i),
           CASE WHEN bool_or(nullif(e.tenant, '') IS NOT NULL) THEN array_agg(nullif(e.tenant, '') ORDER BY e.i) END,
           CASE WHEN bool_or(nullif(e.dk, '') IS NOT NULL) THEN array_agg(nullif(e.dk, '') ORDER BY e.i) END,
           CASE WHEN bool_or(nullif(e.ok, '') IS NOT NULL) THEN array_agg(nullif(e.ok, '') ORDER BY e.i) END,
           CASE WHEN bool_or(nullif(e.trace, '') IS NOT NULL) THEN array_agg(nullif(e.trace, '') ORDER BY e.i) END
      INTO v_max_payload, v_max_key, v_max_headers, v_max_header_value, v_max_delay, v_allowed, v_ids, p_tenant_ids, p_dedupe_keys, p_ordering_keys, p_trace_headers
      FROM unnest(p_namespaces, p_tenant_ids, p_dedupe_keys, p_ordering_keys, p_trace_headers) WITH ORDINALITY
           AS e(ns, tenant, dk, ok, trace, i);

    IF v_allowed IS NOT NULL THEN
        SELECT ARRAY[x.i::text, x.ns] INTO v_problem
        FROM unnest(p_namespaces) WITH ORDINALITY AS x(ns, i)
        WHERE NOT (x.ns = ANY (v_allowed))
        ORDER BY x.i LIMIT 1;
        IF v_problem IS NOT NULL THEN
            RAISE EXCEPTION '%: login % may not enqueue into namespace %', v_caller, session_user, quote_literal(v_problem[2])
                USING ERRCODE = '42501', COLUMN = 'namespace',
                      DETAIL = format('message index: %s', CASE WHEN v_caller = 'outbox.enqueue' THEN -1 ELSE v_problem[1]::int - 1 END),
                      HINT = format('Its roles may enqueue into: %s. An operator grants more with outbox.grant_namespace(role, namespace).',
                                    array_to_string(v_allowed, ', '));
        END IF;
        v_problem := NULL;
    END IF;

    -- Every check, and the parse of payloads and headers for the insert, in
    -- one pass; the first message at fault is named. A payload is parsed
    -- only once it is known not to be over the limit. The name patterns are
    -- unbounded with a separate length check: PostgreSQL's regular
    -- expressions are ten times slower with {0,127}. A document PostgreSQL
    -- cannot store (bad syntax, \u0000, a lone surrogate, a number beyond
    -- numeric) fails the parse; the handler finds which. The block only
    -- reads, so its subtransaction takes no transaction id.
    BEGIN
        SELECT ARRAY[(array_agg(x.i::text ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1],
                     (array_agg(x.problem[1] ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1],
                     (array_agg(x.problem[2] ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1]],
               array_agg(x.pj ORDER BY x.i), array_agg(x.hj ORDER BY x.i)
          INTO v_problem, v_payloads, v_headers
          FROM (
            SELECT e.i, c.pj, c.hj, CASE
                WHEN e.ns IS NULL OR e.ns = '' THEN ARRAY['namespace', 'must not be empty']
                WHEN octet_length(e.ns) > 128 OR e.ns !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' THEN
                    ARRAY['namespace', format('%s must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit', quote_literal(left(e.ns, 140)))]
                WHEN e.tp IS NULL OR e.tp = '' THEN ARRAY['topic', 'must not be empty']
                WHEN octet_length(e.tp) > 128 OR e.tp !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' THEN
                    ARRAY['topic', format('%s must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit', quote_literal(left(e.tp, 140)))]
                WHEN e.payload IS NULL OR e.payload = '' THEN ARRAY['payload', 'must not be empty']
                WHEN octet_length(e.payload) > v_max_payload THEN
                    ARRAY['payload', format('is %s bytes, over the limit of %s', octet_length(e.payload), v_max_payload)]
                WHEN jsonb_typeof(c.pj) NOT IN ('object', 'array') THEN
                    ARRAY['payload', 'must be a JSON object or array, not a ' || jsonb_typeof(c.pj)]
                WHEN octet_length(e.tenant) > v_max_key THEN
                    ARRAY['tenant_id', format('is %s bytes, over the limit of %s', octet_length(e.tenant), v_max_key)]
                WHEN e.tenant ~ c_control THEN ARRAY['tenant_id', 'contains a control character']
                WHEN octet_length(e.dk) > v_max_key THEN
                    ARRAY['dedupe_key', format('is %s bytes, over the limit of %s', octet_length(e.dk), v_max_key)]
                WHEN e.dk ~ c_control THEN ARRAY['dedupe_key', 'contains a control character']
                WHEN octet_length(e.ok) > v_max_key THEN
                    ARRAY['ordering_key', format('is %s bytes, over the limit of %s', octet_length(e.ok), v_max_key)]
                WHEN e.ok ~ c_control THEN ARRAY['ordering_key', 'contains a control character']
                WHEN octet_length(e.trace) > 256 THEN ARRAY['trace_header', format('is %s bytes, over the limit of 256', octet_length(e.trace))]
                WHEN e.trace !~ '^[!-~]*$' THEN ARRAY['trace_header', 'must be printable ASCII without spaces']
                WHEN NOT isfinite(e.at) THEN ARRAY['available_at', format('must be a finite time, got %s', e.at)]
                -- The clock now, not the transaction's start: a producer's
                -- own check of the same bound, made just before, must not be
                -- looser.
                WHEN e.at > clock_timestamp() + v_max_delay THEN
                    ARRAY['available_at', format('is more than %s ahead (%s); the limit is outbox.limits.max_delay', v_max_delay, e.at)]
                WHEN octet_length(e.headers) > 1048576 THEN ARRAY['headers', 'are over 1 MiB of JSON']
                WHEN c.hj IS NULL OR c.hj = '{}'::jsonb THEN NULL
                WHEN jsonb_typeof(c.hj) <> 'object' THEN ARRAY['headers', 'must be a JSON object of strings']
                WHEN (SELECT count(*) FROM jsonb_object_keys(c.hj)) > v_max_headers THEN
                    ARRAY['headers', format('has %s entries, more than the limit of %s',
                                            (SELECT count(*) FROM jsonb_object_keys(c.hj)), v_max_headers)]
                ELSE (SELECT ARRAY['headers', h.problem]
                      FROM (SELECT kv.key, CASE
                                WHEN octet_length(kv.key) > 64 OR kv.key !~ '^[A-Za-z0-9][A-Za-z0-9_.-]*$' THEN
                                    format('name %s must be 1-64 characters of letters, digits and _ . -, starting with a letter or digit', quote_ident(left(kv.key, 80)))
                                WHEN lower(kv.key) LIKE ANY (ARRAY['outbox%', 'webhook-%', 'aws.%', 'amazon.%', 'x-amz%'])
                                     OR lower(kv.key) IN ('content-type', 'content-length', 'host', 'idempotency-key',
                                                          'user-agent', 'connection', 'transfer-encoding') THEN
                                    format('name %s is reserved for the dispatcher', quote_ident(kv.key))
                                WHEN jsonb_typeof(kv.value) <> 'string' THEN
                                    format('value of %s must be a string, got %s', quote_ident(kv.key), jsonb_typeof(kv.value))
                                WHEN octet_length(kv.value #>> '{}') > v_max_header_value THEN
                                    format('value of %s is %s bytes, over the limit of %s', quote_ident(kv.key),
                                           octet_length(kv.value #>> '{}'), v_max_header_value)
                                WHEN (kv.value #>> '{}') ~ c_control THEN
                                    format('value of %s contains a control character', quote_ident(kv.key))
                            END AS problem
                            FROM jsonb_each(c.hj) kv) h
                      WHERE h.problem IS NOT NULL
                      ORDER BY h.key
                      LIMIT 1)
            END AS problem
            FROM unnest(p_namespaces, p_topics, p_payloads, p_tenant_ids, p_dedupe_keys, p_ordering_keys,
                        p_trace_headers, p_available_at, p_headers) WITH ORDINALITY
                 AS e(ns, tp, payload, tenant, dk, ok, trace, at, headers, i)
            CROSS JOIN LATERAL (
                SELECT CASE WHEN octet_length(e.payload) BETWEEN 1 AND v_max_payload THEN e.payload::jsonb END AS pj,
                       CASE WHEN octet_length(e.headers) <= 1048576 THEN e.headers::jsonb END AS hj) c
          ) x;
    EXCEPTION WHEN data_exception THEN
        FOR i IN 1 .. v_n LOOP
            BEGIN
                PERFORM CASE WHEN octet_length(p_payloads[i]) <= v_max_payload THEN p_payloads[i]::jsonb END;
            EXCEPTION WHEN data_exception THEN
                v_problem := ARRAY[i::text, 'payload', 'is not valid JSON: ' || SQLERRM];
                EXIT;
            END;
            BEGIN
                PERFORM CASE WHEN octet_length(p_headers[i]) <= 1048576 THEN p_headers[i]::jsonb END;
            EXCEPTION WHEN data_exception THEN
                v_problem := ARRAY[i::text, 'headers', 'are not valid JSON: ' || SQLERRM];
                EXIT;
            END;
        END LOOP;
        IF v_problem[1] IS NULL THEN
            RAISE;
        END IF;
    END;

    IF v_problem[1] IS NOT NULL THEN
        -- DETAIL carries the message's index in the batch, for callers.
        IF v_caller = 'outbox.enqueue' THEN
            RAISE EXCEPTION '%: invalid message: % %', v_caller, v_problem[2], v_problem[3]
                USING ERRCODE = 'P7004', COLUMN = v_problem[2], DETAIL = 'message index: -1';
        END IF;
        RAISE EXCEPTION '%: invalid message %: % %', v_caller, v_problem[1]::int - 1, v_problem[2], v_problem[3]
            USING ERRCODE = 'P7004', COLUMN = v_problem[2], DETAIL = format('message index: %s', v_problem[1]::int - 1);
    END IF;

    -- 3. Claim the dedupe keys, in key order; the lowest position wins a key
    --    repeated within the batch. Concurrent batches sharing keys lock them
    --    in the same order, so they cannot deadlock.
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

    -- 4. Sequence ids for the inserted messages with an ordering key: each
    --    key's allocator moves once by its count, in key order. The row lock
    --    it takes serialises the key's producers until commit, so sequence
    --    order is commit order.
    IF p_ordering_keys IS NOT NULL THEN
        SELECT f.last_sequence_id INTO v_floor FROM outbox.sequence_floor f;
        WITH e AS (
            SELECT x.ns, x.ok, x.ord, row_number() OVER (PARTITION BY x.ns, x.ok ORDER BY x.ord) AS rank
            FROM unnest(p_namespaces, p_ordering_keys, v_inserted) WITH ORDINALITY AS x(ns, ok, ins, ord)
            WHERE x.ok IS NOT NULL AND x.ins
        ),
        counts AS (
            SELECT e.ns, e.ok, count(*) AS n FROM e GROUP BY e.ns, e.ok
        ),
        bumped AS (
            INSERT INTO outbox.sequences AS s (namespace, ordering_key, last_sequence_id)
            SELECT c.ns, c.ok, v_floor + c.n FROM counts c ORDER BY c.ns, c.ok
            ON CONFLICT ON CONSTRAINT sequences_pkey
                DO UPDATE SET last_sequence_id = s.last_sequence_id + (excluded.last_sequence_id - v_floor),
                              updated_at = now()
            RETURNING s.namespace, s.ordering_key, s.last_sequence_id
        )
        SELECT array_agg(CASE WHEN e.ok IS NULL THEN NULL ELSE b.last_sequence_id - c.n + e.rank END ORDER BY g.ord)
        INTO v_seqs
        FROM generate_series(1, v_n) AS g(ord)
        LEFT JOIN e ON e.ord = g.ord
        LEFT JOIN counts c ON c.ns = e.ns AND c.ok = e.ok
        LEFT JOIN bumped b ON b.namespace = e.ns AND b.ordering_key = e.ok;

        IF p_dedupe_keys IS NOT NULL THEN
            UPDATE outbox.dedupe d SET sequence_id = x.seq
            FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_seqs, v_inserted) AS x(ns, tp, dk, seq, ins)
            WHERE x.ins AND x.dk IS NOT NULL AND x.seq IS NOT NULL
              AND (d.namespace, d.topic, d.dedupe_key) = (x.ns, x.tp, x.dk);
        END IF;
    END IF;

    -- 5. The messages themselves. An ordered message starts behind; its
    --    key is settled when this transaction commits (the trigger on
    --    outbox.sequences), which makes it the head if it is first in line.
    INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                payload, payload_bytes, headers, trace_header, available_at, next_attempt_at, behind)
    SELECT x.id, x.ns, x.tp, x.tenant, x.dk, x.ok, x.seq, x.payload, octet_length(x.payload_text),
           coalesce(x.headers, '{}'::jsonb), x.trace,
           greatest(coalesce(x.at, v_now), v_now), greatest(coalesce(x.at, v_now), v_now), x.ok IS NOT NULL
    FROM unnest(v_ids, p_namespaces, p_topics, p_tenant_ids, p_dedupe_keys, p_ordering_keys, v_seqs,
                v_payloads, p_payloads, v_headers, p_trace_headers, p_available_at, v_inserted)
         AS x(id, ns, tp, tenant, dk, ok, seq, payload, payload_text, headers, trace, at, ins)
    WHERE x.ins;

    -- 6. One row per message, in order; a dedupe hit answers with the
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
                                    next_attempt_at, created_at, last_error_code, last_error, behind, park_on_dead)
        SELECT m.id, m.namespace, m.topic, m.tenant_id, m.dedupe_key, m.ordering_key, m.sequence_id,
               m.payload, m.payload_bytes, m.headers, m.trace_header, 0, now(), now(), m.created_at,
               m.last_error_code, m.last_error, m.ordering_key IS NOT NULL, m.holds_key
        FROM moved m
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.purge(
    p_attempts_older_than interval,
    p_dedupe_older_than   interval,
    p_max_rows            int,
    p_keys_older_than     interval DEFAULT NULL)
RETURNS TABLE(purged_attempts bigint, purged_dedupe bigint, purged_keys bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- A batch's per-row probes make its plans' costs look huge; compiling them
-- (350 ms for the dedupe purge of 10,000 rows) costs more than running them.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_attempts bigint := 0;
    v_dedupe   bigint := 0;
    v_keys     bigint := 0;
    v_floor    bigint;
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    -- The archive is the audit trail, and a dedupe key the only guard
    -- against a producer's retry enqueueing twice: whoever calls this may
    -- not shorten them below an hour, as the reaper's own settings may not.
    IF p_attempts_older_than < interval '1 hour' OR p_dedupe_older_than < interval '1 hour'
       OR p_keys_older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'outbox.purge: retention must be at least 1 hour (or NULL to keep), got attempts %, dedupe %, keys %',
            p_attempts_older_than, p_dedupe_older_than, p_keys_older_than USING ERRCODE = '22023';
    END IF;
    -- One retention pass at a time (purge_audit included): a pass locks the
    -- dedupe keys whose outcomes it moves before the archive rows it
    -- deletes, then the keys it deletes, and two passes of different
    -- retentions would take them in orders that can deadlock.
    PERFORM pg_advisory_xact_lock(hashtext('outbox'), hashtext('purge'));

    -- A NULL interval leaves that table alone. The history of a message
    -- that is still pending or dead is kept whatever its age: it is what an
    -- operator reads when deciding what to do with it. Operators' own
    -- actions (REPLAYED, DISCARDED) are not the dispatcher's to erase: only
    -- outbox.purge_audit, an operator's, deletes them. A delivery's time
    -- survives its row in the key it still guards (see forget_attempts).
    --
    -- A batch costs the rows it reads: each check is a primary key probe
    -- (OFFSET 0 keeps the planner from hashing all of pending or dead for
    -- an anti-join), and the keys are deleted by their ctids.
    IF p_attempts_older_than IS NOT NULL THEN
        v_attempts := outbox.forget_attempts(ARRAY(
            SELECT o.id FROM outbox.attempts o
            WHERE o.created_at < now() - p_attempts_older_than
              AND o.state NOT IN ('REPLAYED', 'DISCARDED')
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
            LIMIT p_max_rows));
    END IF;

    -- A dedupe key outlives its message by the retention window, counted
    -- from the message's terminal outcome (delivered or discarded), never
    -- from its enqueue: a message that waited longer than the window (its
    -- retries, AvailableAt, an outage) keeps its key for the whole window
    -- after it went. While the message is pending or dead, its key stays,
    -- and so does a key whose outcome is known nowhere (the archive has no
    -- terminal row and the key no settled_at: only a hand edit does that).
    -- The key's own age is a cheap first filter, since no message goes
    -- before it is enqueued.
    IF p_dedupe_older_than IS NOT NULL THEN
        DELETE FROM outbox.dedupe x
        WHERE x.ctid = ANY (ARRAY(
            SELECT k.ctid FROM outbox.dedupe k
            WHERE k.created_at < now() - p_dedupe_older_than
              -- The latest outcome known, in the key or in the archive
              -- (greatest ignores a NULL; two NULLs keep the key).
              AND greatest(k.settled_at,
                           (SELECT max(a.created_at) FROM outbox.attempts a
                            WHERE a.message_id = k.message_id AND a.state IN ('DISPATCHED', 'DISCARDED')))
                  < now() - p_dedupe_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = k.message_id OFFSET 0)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = k.message_id OFFSET 0)
            LIMIT p_max_rows));
        GET DIAGNOSTICS v_dedupe = ROW_COUNT;
    END IF;

    -- A key with nothing pending or dead, idle for the retention window,
    -- loses its bookkeeping (sequence allocator and key row). Its sequence
    -- ids must never go back if it comes back, so a key is forgotten only
    -- once outbox.sequence_floor (which new keys start above) covers it, and
    -- the floor is raised in an earlier pass than the one that forgets: a
    -- producer that read the old floor has committed or failed by then.
    IF p_keys_older_than IS NOT NULL THEN
        SELECT f.last_sequence_id INTO v_floor FROM outbox.sequence_floor f;
        WITH idle AS (
            SELECT s.namespace, s.ordering_key, s.last_sequence_id
            FROM outbox.sequences s
            WHERE s.updated_at < now() - p_keys_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p
                              WHERE p.namespace = s.namespace AND p.ordering_key = s.ordering_key)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d
                              WHERE d.namespace = s.namespace AND d.ordering_key = s.ordering_key)
              AND NOT EXISTS (SELECT 1 FROM outbox.unsettled_keys u
                              WHERE u.namespace = s.namespace AND u.ordering_key = s.ordering_key)
            ORDER BY s.updated_at
            LIMIT p_max_rows
            -- A producer enqueueing to the key right now holds its row.
            FOR UPDATE OF s SKIP LOCKED
        ),
        -- And whoever is settling it right now holds its key row.
        unlocked AS (
            SELECT k.namespace, k.ordering_key FROM outbox.keys k JOIN idle i USING (namespace, ordering_key)
            FOR UPDATE OF k SKIP LOCKED
        ),
        forgotten AS (
            DELETE FROM outbox.sequences s
            USING idle i
            WHERE s.namespace = i.namespace AND s.ordering_key = i.ordering_key AND i.last_sequence_id <= v_floor
              AND (EXISTS (SELECT 1 FROM unlocked u WHERE u.namespace = i.namespace AND u.ordering_key = i.ordering_key)
                   OR NOT EXISTS (SELECT 1 FROM outbox.keys k WHERE k.namespace = i.namespace AND k.ordering_key = i.ordering_key))
            RETURNING s.namespace, s.ordering_key
        ),
        unkeyed AS (
            DELETE FROM outbox.keys k USING forgotten f
            WHERE k.namespace = f.namespace AND k.ordering_key = f.ordering_key
        ),
        raised AS (
            UPDATE outbox.sequence_floor f
            SET last_sequence_id = (SELECT max(i.last_sequence_id) FROM idle i)
            WHERE (SELECT max(i.last_sequence_id) FROM idle i) > f.last_sequence_id
        )
        SELECT count(*) INTO v_keys FROM forgotten;
    END IF;

    RETURN QUERY SELECT v_attempts, v_dedupe, v_keys;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.purge_audit(
    p_older_than interval,
    p_max_rows   int,
    p_operator   text DEFAULT NULL,
    p_reason     text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Operators' actions in the archive (REPLAYED, DISCARDED) older than
-- p_older_than, of messages no longer pending or dead: the audit trail,
-- which outbox.purge leaves alone and only an operator may shorten. The
-- purge itself is recorded in outbox.operator_log, which nothing shortens.
DECLARE
    v_n bigint;
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '1 day' THEN
        RAISE EXCEPTION 'outbox.purge_audit: the audit trail is kept at least 1 day, got %', p_older_than
            USING ERRCODE = '22023';
    END IF;
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge_audit: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    -- One retention pass at a time: see outbox.purge.
    PERFORM pg_advisory_xact_lock(hashtext('outbox'), hashtext('purge'));
    v_n := outbox.forget_attempts(ARRAY(
        SELECT o.id FROM outbox.attempts o
        WHERE o.created_at < now() - p_older_than
          AND o.state IN ('REPLAYED', 'DISCARDED')
          AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
          AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
        LIMIT p_max_rows));
    PERFORM outbox.record_operator_action('purge_audit', 'outbox.attempts', p_operator, p_reason,
        jsonb_build_object('older_than', p_older_than::text, 'max_rows', p_max_rows, 'purged', v_n));
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.stats()
RETURNS TABLE(namespace text, topic text, pending bigint, due bigint, leased bigint,
              expired_leases bigint, oldest_pending_age_seconds double precision, dead bigint,
              blocked_keys bigint, oldest_blocked_key_age_seconds double precision)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH p AS (
        SELECT p.namespace, p.topic,
               count(*) AS pending,
               count(*) FILTER (WHERE p.lease_token IS NULL AND NOT p.behind AND p.next_attempt_at <= now()) AS due,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL) AS leased,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL AND p.lease_expires_at <= clock_timestamp()) AS expired_leases,
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
    ),
    -- Blocked keys, as blocked_keys() lists them, count under the topic of
    -- the message each waits on.
    b AS (
        SELECT x.namespace, x.topic, count(*) AS blocked,
               extract(epoch FROM clock_timestamp() - min(x.since))::double precision AS oldest
        FROM outbox.blocked_key_states(NULL) x
        GROUP BY x.namespace, x.topic
    ),
    pairs AS (
        SELECT p.namespace, p.topic FROM p UNION SELECT d.namespace, d.topic FROM d
        UNION SELECT b.namespace, b.topic FROM b
    )
    SELECT k.namespace, k.topic,
           coalesce(p.pending, 0), coalesce(p.due, 0), coalesce(p.leased, 0),
           coalesce(p.expired_leases, 0), coalesce(greatest(p.oldest, 0), 0), coalesce(d.dead, 0),
           coalesce(b.blocked, 0), coalesce(greatest(b.oldest, 0), 0)
    FROM pairs k
    LEFT JOIN p ON p.namespace = k.namespace AND p.topic = k.topic
    LEFT JOIN d ON d.namespace = k.namespace AND d.topic = k.topic
    LEFT JOIN b ON b.namespace = k.namespace AND b.topic = k.topic
    ORDER BY 1, 2
$$;
-- +goose StatementEnd
GRANT EXECUTE ON FUNCTION outbox.stats() TO outbox_dispatcher, outbox_operator, outbox_reader;
DROP FUNCTION outbox.is_paused(text, text);
DROP TABLE outbox.paused;
DROP INDEX outbox.pending_paused;
DROP INDEX outbox.pending_claimable;
ALTER TABLE outbox.pending DROP COLUMN paused;
CREATE INDEX pending_claimable ON outbox.pending (next_attempt_at, id) WHERE lease_token IS NULL AND NOT behind;
-- RESCHEDULED rows stay, as REPLAYED ones did when migration 5 went down.
ALTER TABLE outbox.attempts
    DROP CONSTRAINT attempts_state_valid,
    ADD CONSTRAINT attempts_state_valid
        CHECK (state IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'ZOMBIE_REQUEUE', 'REPLAYED', 'DISCARDED')) NOT VALID;
