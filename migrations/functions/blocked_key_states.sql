-- blocked_key_states is the one definition of a blocked key, which
-- blocked_keys() lists and stats() counts: one row per ordering key that
-- cannot move, with why, since when, and the message it waits on.
--   parked         its head died under on_dead = park and holds it (since
--                  it died; the dead message);
--   lease_expired  its head is leased past its expiry: its dispatcher died
--                  or stalled (since the expiry);
--   retrying       its head keeps failing (since its first failure);
--   unsettled      it has messages but no head: a dispatcher could not
--                  settle it while a producer held its lock, and the next
--                  claim has not yet (since the debt; the message next in
--                  line). A debt on a key that has a head, or nothing
--                  pending, blocks nothing.
-- A key in more than one of these is reported once, in the first that
-- applies. Not executable by any runtime role; blocked_keys() and stats()
-- call it as its owner.
CREATE OR REPLACE FUNCTION outbox.blocked_key_states(p_namespace text)
RETURNS TABLE(namespace text, ordering_key text, state text, since timestamptz, message_id uuid,
              sequence_id bigint, topic text, attempt_count int, error_code text, error text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT ON (b.namespace, b.ordering_key)
           b.namespace, b.ordering_key, b.state, b.since, b.id, b.sequence_id, b.topic,
           b.attempt_count, b.last_error_code, b.last_error
    FROM (
        SELECT 1 AS rank, d.namespace, d.ordering_key, 'parked' AS state, d.failed_at AS since, d.id,
               d.sequence_id, d.topic, d.attempt_count, d.last_error_code, d.last_error
        FROM outbox.dead d
        WHERE d.holds_key AND (p_namespace IS NULL OR d.namespace = p_namespace)
        UNION ALL
        SELECT 2, p.namespace, p.ordering_key,
               CASE WHEN p.lease_token IS NOT NULL THEN 'lease_expired' ELSE 'retrying' END,
               CASE WHEN p.lease_token IS NOT NULL THEN p.lease_expires_at ELSE p.failing_since END,
               p.id, p.sequence_id, p.topic, p.attempt_count, p.last_error_code, p.last_error
        FROM outbox.pending p
        WHERE p.ordering_key IS NOT NULL AND NOT p.behind
          AND ((p.lease_token IS NULL AND p.failing_since IS NOT NULL)
               OR (p.lease_token IS NOT NULL AND p.lease_expires_at <= clock_timestamp()))
          AND (p_namespace IS NULL OR p.namespace = p_namespace)
        UNION ALL
        SELECT 3, u.namespace, u.ordering_key, 'unsettled', u.since, n.id, n.sequence_id, n.topic,
               n.attempt_count, n.last_error_code,
               'a producer was committing to the key when its head changed; the next claim settles it'
        FROM (SELECT x.namespace, x.ordering_key, min(x.since) AS since
              FROM outbox.unsettled_keys x
              WHERE p_namespace IS NULL OR x.namespace = p_namespace
              GROUP BY x.namespace, x.ordering_key) u
        CROSS JOIN LATERAL (SELECT q.id, q.sequence_id, q.topic, q.attempt_count, q.last_error_code
                            FROM outbox.pending q
                            WHERE q.namespace = u.namespace AND q.ordering_key = u.ordering_key
                            ORDER BY q.sequence_id
                            LIMIT 1) n
        WHERE NOT EXISTS (SELECT 1 FROM outbox.pending h
                          WHERE h.namespace = u.namespace AND h.ordering_key = u.ordering_key AND NOT h.behind)
    ) b
    ORDER BY b.namespace, b.ordering_key, b.rank
$$;
REVOKE ALL ON FUNCTION outbox.blocked_key_states(p_namespace text) FROM PUBLIC;
