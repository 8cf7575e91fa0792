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
-- compilation, far dearer than the statement (docs/PERFORMANCE.md).
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_ns      text[];
    v_ok      text[];
    v_low     bigint[];
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
               array_agg(x.ordering_key ORDER BY x.namespace, x.ordering_key),
               array_agg(x.low_sequence_id ORDER BY x.namespace, x.ordering_key)
          INTO v_ns, v_ok, v_low
          FROM (SELECT k.namespace, k.ordering_key, k.low_sequence_id FROM outbox.keys k
                WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(p_namespaces, p_keys))
                ORDER BY 1, 2
                FOR UPDATE) x;
    ELSE
        SELECT array_agg(x.namespace ORDER BY x.namespace, x.ordering_key),
               array_agg(x.ordering_key ORDER BY x.namespace, x.ordering_key),
               array_agg(x.low_sequence_id ORDER BY x.namespace, x.ordering_key)
          INTO v_ns, v_ok, v_low
          FROM (SELECT k.namespace, k.ordering_key, k.low_sequence_id FROM outbox.keys k
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
    --    claim holds it): the key's lowest pending message, looked for from
    --    the key's low_sequence_id up, and that sequence id raised to it.
    SELECT array_agg(s.head ORDER BY s.i), array_agg(s.want ORDER BY s.i),
           bool_or(s.want IS DISTINCT FROM s.head), bool_or(s.want IS NULL),
           array_agg(s.next_low ORDER BY s.i)
      INTO v_head, v_want, v_change, v_headless, v_low
      FROM (SELECT k.i, h.id AS head,
                   CASE WHEN k.parked THEN NULL
                        WHEN h.lease_token IS NOT NULL THEN h.id
                        ELSE n.id
                   END AS want,
                   -- Raised only to a lowest message found: below a head in
                   -- flight, a replayed message may wait.
                   CASE WHEN k.parked OR h.lease_token IS NOT NULL THEN k.low
                        ELSE greatest(k.low, n.sequence_id)
                   END AS next_low
            FROM (SELECT k.*, EXISTS (SELECT 1 FROM outbox.dead d
                                      WHERE d.namespace = k.ns AND d.ordering_key = k.ok AND d.holds_key) AS parked
                  FROM unnest(v_ns, v_ok, v_low) WITH ORDINALITY AS k(ns, ok, low, i)) k
            LEFT JOIN outbox.pending h ON h.namespace = k.ns AND h.ordering_key = k.ok AND NOT h.behind
            LEFT JOIN LATERAL (
                SELECT p.id, p.sequence_id FROM outbox.pending p
                WHERE NOT k.parked AND h.lease_token IS NULL
                  AND p.namespace = k.ns AND p.ordering_key = k.ok AND p.sequence_id >= k.low
                ORDER BY p.sequence_id LIMIT 1) n ON true
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

    -- The keys whose low sequence id moved up (their old heads left).
    UPDATE outbox.keys k SET low_sequence_id = x.low
    FROM unnest(v_ns, v_ok, v_low) AS x(ns, ok, low)
    WHERE k.namespace = x.ns AND k.ordering_key = x.ok AND k.low_sequence_id < x.low;

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
REVOKE ALL ON FUNCTION outbox.settle_keys(p_namespaces text[], p_keys text[], p_wait boolean) FROM PUBLIC;
