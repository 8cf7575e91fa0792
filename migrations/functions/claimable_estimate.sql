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
REVOKE ALL ON FUNCTION outbox.claimable_estimate(p_limit integer, p_namespaces text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.claimable_estimate(p_limit integer, p_namespaces text[]) TO outbox_dispatcher;
