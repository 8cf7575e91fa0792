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
-- compilation, far dearer than the statement (docs/PERFORMANCE.md).
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
    v_bytes    int[];
    -- The longest JSON text parsed: a stored document can be shorter than
    -- the text sent (spaces, escapes), but not by this much.
    v_max_text int;
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
           -- The namespaces this login is confined to (NULL: not confined;
           -- empty: confined to none, every grant revoked).
           (SELECT coalesce(array_agg(g.namespace) FILTER (WHERE g.namespace IS NOT NULL), '{}')
            FROM outbox.confined_producers c
            JOIN pg_catalog.pg_roles r ON r.rolname = c.role_name
            LEFT JOIN outbox.producer_namespaces g ON g.role_name = c.role_name
            WHERE pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')
              AND NOT (SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname = session_user)
            HAVING count(*) > 0),
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
    v_max_text := least(8 * v_max_payload::bigint, 1073741823);

    IF v_allowed IS NOT NULL THEN
        SELECT ARRAY[x.i::text, x.ns] INTO v_problem
        FROM unnest(p_namespaces) WITH ORDINALITY AS x(ns, i)
        WHERE NOT (x.ns = ANY (v_allowed))
        ORDER BY x.i LIMIT 1;
        IF v_problem IS NOT NULL THEN
            RAISE EXCEPTION '%: login % may not enqueue into namespace %', v_caller, session_user, quote_literal(v_problem[2])
                USING ERRCODE = '42501', COLUMN = 'namespace',
                      DETAIL = format('message index: %s', CASE WHEN v_caller = 'outbox.enqueue' THEN -1 ELSE v_problem[1]::int - 1 END),
                      HINT = CASE WHEN cardinality(v_allowed) = 0 THEN
                                 'Its roles are confined and every namespace they had was revoked. An operator grants one with outbox.grant_namespace(role, namespace), or lifts the confinement with outbox.unconfine_producer(role).'
                             ELSE format('Its roles may enqueue into: %s. An operator grants more with outbox.grant_namespace(role, namespace).',
                                         array_to_string(v_allowed, ', ')) END;
        END IF;
        v_problem := NULL;
    END IF;

    -- Every check, and the parse of payloads and headers for the insert, in
    -- one pass; the first message at fault is named. A payload is parsed
    -- only when its text is not far over the limit, and measured as stored
    -- only once nothing refuses it. A document PostgreSQL cannot store (bad
    -- syntax, \u0000, a lone surrogate, a number beyond numeric) fails the
    -- parse; the handler finds which. The block only reads, so its
    -- subtransaction takes no transaction id.
    BEGIN
        SELECT ARRAY[(array_agg(x.i::text ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1],
                     (array_agg(x.problem[1] ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1],
                     (array_agg(x.problem[2] ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1]],
               array_agg(x.pj ORDER BY x.i), array_agg(x.bytes ORDER BY x.i), array_agg(x.hj ORDER BY x.i)
          INTO v_problem, v_payloads, v_bytes, v_headers
          FROM (
            SELECT e.i, c.pj, d.bytes, c.hj, CASE
                WHEN e.ns IS NULL OR e.ns = '' THEN ARRAY['namespace', 'must not be empty']
                WHEN NOT outbox.valid_name(e.ns) THEN
                    ARRAY['namespace', format('%s must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit', quote_literal(left(e.ns, 140)))]
                WHEN e.tp IS NULL OR e.tp = '' THEN ARRAY['topic', 'must not be empty']
                WHEN NOT outbox.valid_name(e.tp) THEN
                    ARRAY['topic', format('%s must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit', quote_literal(left(e.tp, 140)))]
                WHEN e.payload IS NULL OR e.payload = '' THEN ARRAY['payload', 'must not be empty']
                WHEN c.pj IS NULL THEN
                    ARRAY['payload', format('is %s bytes of JSON text, far over the limit of %s', octet_length(e.payload), v_max_payload)]
                WHEN jsonb_typeof(c.pj) NOT IN ('object', 'array') THEN
                    ARRAY['payload', 'must be a JSON object or array, not a ' || jsonb_typeof(c.pj)]
                WHEN d.problem IS NOT NULL THEN ARRAY['payload', d.problem]
                WHEN d.bytes > v_max_payload THEN
                    ARRAY['payload', format('is %s bytes as stored, over the limit of %s', d.bytes, v_max_payload)]
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
                                -- The Go producer's list (shared/outbox/headers): the
                                -- dispatcher's own names (ce-* the CloudEvents headers
                                -- of format cloudevents), and what a webhook delivery
                                -- would send outside its signature (credentials, a
                                -- claimed origin, method overrides, hop-by-hop).
                                WHEN lower(kv.key) LIKE ANY (ARRAY['outbox%', 'webhook-%', 'ce-%', 'aws.%', 'amazon.%', 'x-amz%',
                                                                   'x-forwarded-%', 'proxy-%', 'sec-%'])
                                     OR lower(kv.key) IN ('content-type', 'content-length', 'content-encoding', 'host',
                                                          'idempotency-key', 'user-agent', 'connection', 'transfer-encoding',
                                                          'authorization', 'cookie', 'set-cookie', 'forwarded', 'x-real-ip',
                                                          'x-client-ip', 'true-client-ip', 'via', 'origin',
                                                          'x-http-method-override', 'x-http-method', 'x-method-override',
                                                          'te', 'trailer', 'upgrade', 'keep-alive', 'expect') THEN
                                    format('name %s is reserved for the dispatcher', quote_ident(kv.key))
                                WHEN jsonb_typeof(kv.value) <> 'string' THEN
                                    format('value of %s must be a string, got %s', quote_ident(kv.key), jsonb_typeof(kv.value))
                                WHEN octet_length(kv.value #>> '{}') > v_max_header_value THEN
                                    format('value of %s is %s bytes, over the limit of %s', quote_ident(kv.key),
                                           octet_length(kv.value #>> '{}'), v_max_header_value)
                                WHEN (kv.value #>> '{}') ~ c_control THEN
                                    format('value of %s contains a control character', quote_ident(kv.key))
                                WHEN lower(kv.key) IN ('traceparent', 'tracestate') THEN
                                    outbox.trace_context_problem(kv.key, kv.value #>> '{}', c.hj ? 'traceparent')
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
                SELECT CASE WHEN octet_length(e.payload) BETWEEN 1 AND v_max_text THEN e.payload::jsonb END AS pj,
                       CASE WHEN octet_length(e.headers) <= 1048576 THEN e.headers::jsonb END AS hj) c
            -- The stored size, measured only once nothing refuses the
            -- document (payload_problem), so that it never writes out a
            -- number of a hundred thousand digits.
            CROSS JOIN LATERAL (
                SELECT p.problem, CASE WHEN p.problem IS NULL THEN outbox.stored_bytes(c.pj) END AS bytes
                FROM (SELECT outbox.payload_problem(c.pj) AS problem OFFSET 0) p) d
          ) x;
    EXCEPTION WHEN data_exception OR statement_too_complex THEN
        FOR i IN 1 .. v_n LOOP
            BEGIN
                PERFORM CASE WHEN octet_length(p_payloads[i]) <= v_max_text THEN p_payloads[i]::jsonb END;
            EXCEPTION WHEN data_exception OR statement_too_complex THEN
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
    SELECT x.id, x.ns, x.tp, x.tenant, x.dk, x.ok, x.seq, x.payload, x.bytes,
           coalesce(x.headers, '{}'::jsonb), x.trace,
           greatest(coalesce(x.at, v_now), v_now), greatest(coalesce(x.at, v_now), v_now), x.ok IS NOT NULL,
           v_paused AND EXISTS (SELECT 1 FROM outbox.paused z WHERE z.namespace = x.ns AND z.topic IN (x.tp, '*'))
    FROM unnest(v_ids, p_namespaces, p_topics, p_tenant_ids, p_dedupe_keys, p_ordering_keys, v_seqs,
                v_payloads, v_bytes, v_headers, p_trace_headers, p_available_at, v_inserted)
         AS x(id, ns, tp, tenant, dk, ok, seq, payload, bytes, headers, trace, at, ins)
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
REVOKE ALL ON FUNCTION outbox.enqueue_batch(p_namespaces text[], p_topics text[], p_payloads text[], p_tenant_ids text[], p_dedupe_keys text[], p_ordering_keys text[], p_headers text[], p_trace_headers text[], p_available_at timestamp with time zone[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.enqueue_batch(p_namespaces text[], p_topics text[], p_payloads text[], p_tenant_ids text[], p_dedupe_keys text[], p_ordering_keys text[], p_headers text[], p_trace_headers text[], p_available_at timestamp with time zone[]) TO outbox_producer;
