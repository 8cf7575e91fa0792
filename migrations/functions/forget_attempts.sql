-- forget_attempts deletes the archived attempts p_ids, for retention; their
-- message ids (p_message_ids) name the days they are in, so that only those
-- partitions of the archive are read (the ids alone would probe each). The
-- time of a terminal outcome (DISPATCHED, DISCARDED) whose message still has
-- its dedupe key moves into the key first (dedupe.settled_at): the key's
-- window counts from it. Every deletion from the archive goes through here.
-- Not executable by any runtime role; purge and purge_audit call it, under
-- their lock (one retention pass at a time).
CREATE OR REPLACE FUNCTION outbox.forget_attempts(p_ids bigint[], p_message_ids uuid[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- The arrays planned as the values they are: the days are pruned at plan
-- time.
SET plan_cache_mode = force_custom_plan
SET jit = off
AS $$
DECLARE
    v_n bigint;
BEGIN
    -- Each key is found by its primary key and updated by its ctid, so a
    -- batch costs its own rows, never a scan of the dedupe table (which a
    -- hash join would choose for a batch of thousands).
    WITH outcomes AS (
        SELECT a.namespace, a.topic, a.dedupe_key, a.message_id, max(a.created_at) AS at
        FROM outbox.attempts a
        WHERE a.message_id = ANY (p_message_ids) AND a.id = ANY (p_ids) AND a.state IN ('DISPATCHED', 'DISCARDED') AND a.dedupe_key IS NOT NULL
        GROUP BY a.namespace, a.topic, a.dedupe_key, a.message_id
    ),
    kept AS (
        SELECT k.tid, o.at FROM outcomes o
        CROSS JOIN LATERAL (
            SELECT k.ctid AS tid FROM outbox.dedupe k
            WHERE k.namespace = o.namespace AND k.topic = o.topic AND k.dedupe_key = o.dedupe_key
              AND k.message_id = o.message_id
            OFFSET 0) k
    )
    UPDATE outbox.dedupe k SET settled_at = greatest(k.settled_at, t.at)
    FROM kept t
    WHERE k.ctid = t.tid;

    PERFORM set_config('outbox.purge_in_progress', 'on', true);
    DELETE FROM outbox.attempts a WHERE a.message_id = ANY (p_message_ids) AND a.id = ANY (p_ids);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM set_config('outbox.purge_in_progress', 'off', true);
    RETURN v_n;
END;
$$;
REVOKE ALL ON FUNCTION outbox.forget_attempts(p_ids bigint[], p_message_ids uuid[]) FROM PUBLIC;
