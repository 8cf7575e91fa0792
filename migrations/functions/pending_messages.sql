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
REVOKE ALL ON FUNCTION outbox.pending_messages(p_namespace text, p_topic text, p_ordering_key text, p_retrying boolean, p_blocked boolean, p_older_than interval, p_limit integer, p_message_ids uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.pending_messages(p_namespace text, p_topic text, p_ordering_key text, p_retrying boolean, p_blocked boolean, p_older_than interval, p_limit integer, p_message_ids uuid[]) TO outbox_operator, outbox_reader;
