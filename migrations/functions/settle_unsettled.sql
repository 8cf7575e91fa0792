-- settle_unsettled pays up to p_limit debts dispatchers recorded in
-- outbox.unsettled_keys (claims and the reaper call it); a key still locked
-- by someone else gets a new debt. Returns the keys settled.
CREATE OR REPLACE FUNCTION outbox.settle_unsettled(p_limit int)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- At most p_limit debts, by index: see outbox.claim_batch.
SET jit = off
AS $$
DECLARE
    v_ns text[];
    v_ok text[];
BEGIN
    WITH paid AS (
        DELETE FROM outbox.unsettled_keys u
        WHERE u.id IN (SELECT x.id FROM outbox.unsettled_keys x ORDER BY x.id LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING u.namespace, u.ordering_key
    )
    SELECT array_agg(d.namespace), array_agg(d.ordering_key) INTO v_ns, v_ok
    FROM (SELECT DISTINCT p.namespace, p.ordering_key FROM paid p) d;
    IF v_ns IS NULL THEN
        RETURN 0;
    END IF;
    RETURN cardinality(v_ns) - outbox.settle_keys(v_ns, v_ok, false);
END;
$$;
REVOKE ALL ON FUNCTION outbox.settle_unsettled(p_limit integer) FROM PUBLIC;
