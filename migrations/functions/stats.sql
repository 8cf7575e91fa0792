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
REVOKE ALL ON FUNCTION outbox.stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.stats() TO outbox_dispatcher, outbox_operator, outbox_reader;
