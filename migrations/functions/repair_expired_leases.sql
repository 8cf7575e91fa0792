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
-- the keys dispatchers had to leave unsettled.
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
    RETURN v_repaired;
END;
$$;
REVOKE ALL ON FUNCTION outbox.repair_expired_leases(p_batch_size integer, p_worker_id text, p_max_attempts integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.repair_expired_leases(p_batch_size integer, p_worker_id text, p_max_attempts integer) TO outbox_dispatcher;
