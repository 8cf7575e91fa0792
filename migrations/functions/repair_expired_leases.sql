CREATE OR REPLACE FUNCTION outbox.repair_expired_leases(
    p_batch_size   int,
    p_worker_id    text,
    p_max_attempts int DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- At most p_batch_size expired leases and their runs, by index: see
-- claim_batch.
SET jit = off
AS $$
-- The reaper: takes over up to p_batch_size expired leases (by the clock
-- now, not the transaction's start) as outbox.requeue_expired_leases does,
-- with an ordered run repaired whole. Claims take over expired leases too;
-- the reaper is the sweeper for the namespaces nobody claims. Also settles
-- the keys dispatchers had to leave unsettled, and unmarks messages
-- marked paused by a pause that no longer exists.
DECLARE
    v_repaired integer;
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 100000 THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_batch_size must be between 1 and 100000, got %', p_batch_size
            USING ERRCODE = '22023';
    END IF;
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_worker_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_max_attempts must be at least 1, got %', p_max_attempts
            USING ERRCODE = '22023';
    END IF;

    v_repaired := outbox.requeue_expired_leases(p_batch_size, p_worker_id, p_max_attempts, clock_timestamp(), NULL);
    PERFORM outbox.settle_unsettled(1000);
    -- A producer transaction open while a pause was lifted marked its
    -- messages paused (it saw the pause), and the resume could not see
    -- them to unmark them: out of the claim index with no pause left to
    -- end. Unmark them here (by pending_paused, a few rows at most). Should
    -- this unmark a row a pause committing now has just marked, the claim
    -- still refuses it by outbox.paused, as it does any missed mark.
    UPDATE outbox.pending p SET paused = false
    WHERE p.ctid = ANY (ARRAY(
        SELECT q.ctid FROM outbox.pending q
        WHERE q.paused AND NOT outbox.is_paused(q.namespace, q.topic)
        LIMIT 10000
        FOR UPDATE SKIP LOCKED));
    RETURN v_repaired;
END;
$$;
REVOKE ALL ON FUNCTION outbox.repair_expired_leases(p_batch_size integer, p_worker_id text, p_max_attempts integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.repair_expired_leases(p_batch_size integer, p_worker_id text, p_max_attempts integer) TO outbox_dispatcher;
