CREATE OR REPLACE FUNCTION outbox.purge(
    p_attempts_older_than interval,
    p_dedupe_older_than   interval,
    p_max_rows            int,
    p_keys_older_than     interval DEFAULT NULL)
RETURNS TABLE(purged_attempts bigint, purged_dedupe bigint, purged_keys bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- A batch's per-row probes make its plans' costs look huge; compiling them
-- costs more than running them (docs/PERFORMANCE.md).
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_attempts bigint := 0;
    v_dedupe   bigint := 0;
    v_keys     bigint := 0;
    v_floor    bigint;
    -- The rows the row-by-row pass takes.
    v_ids         bigint[];
    v_message_ids uuid[];
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    -- The archive is the audit trail, and a dedupe key the only guard
    -- against a producer's retry enqueueing twice: whoever calls this may
    -- not shorten them below an hour, as the reaper's own settings may not.
    IF p_attempts_older_than < interval '1 hour' OR p_dedupe_older_than < interval '1 hour'
       OR p_keys_older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'outbox.purge: retention must be at least 1 hour (or NULL to keep), got attempts %, dedupe %, keys %',
            p_attempts_older_than, p_dedupe_older_than, p_keys_older_than USING ERRCODE = '22023';
    END IF;
    -- One retention pass at a time (purge_audit included): a pass locks the
    -- dedupe keys whose outcomes it moves before the archive rows it
    -- deletes, then the keys it deletes, and two passes of different
    -- retentions would take them in orders that can deadlock.
    PERFORM pg_advisory_xact_lock(hashtext('outbox'), hashtext('purge'));

    -- A NULL interval leaves that table alone. The history of a message
    -- that is still pending or dead is kept whatever its age: it is what an
    -- operator reads when deciding what to do with it. Operators' own
    -- actions (REPLAYED, DISCARDED, RESCHEDULED) are not the dispatcher's to erase: only
    -- outbox.purge_audit, an operator's, deletes them. A delivery's time
    -- survives its row in the key it still guards (see forget_attempts).
    --
    -- A batch costs the rows it reads: each check is a primary key probe
    -- (OFFSET 0 keeps the planner from hashing all of pending or dead for
    -- an anti-join), and the keys are deleted by their ctids.
    --
    -- The archive is partitioned by the day its messages were made: a day
    -- wholly before the cutoff is dropped whole, at the end of the pass
    -- (drop_expired_archive_partitions). With a retention of a day or more,
    -- only the DEFAULT partition (survivors of days dropped before, days
    -- made late) is purged row by row: a day's partition holds nothing
    -- older than its first message, and the day the cutoff falls in is
    -- left to be dropped whole the next day, so a row outlives its
    -- retention by up to a day rather than be deleted singly. A retention
    -- under a day purges every day row by row, as before.
    IF p_attempts_older_than IS NOT NULL THEN
        IF p_attempts_older_than >= interval '1 day' THEN
            SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.message_id), '{}') INTO v_ids, v_message_ids
            FROM (SELECT o.id, o.message_id FROM outbox.attempts_default o
                  WHERE o.created_at < now() - p_attempts_older_than
                    AND o.state NOT IN ('REPLAYED', 'DISCARDED', 'RESCHEDULED')
                    AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
                    AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
                  LIMIT p_max_rows) x;
        ELSE
            SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.message_id), '{}') INTO v_ids, v_message_ids
            FROM (SELECT o.id, o.message_id FROM outbox.attempts o
                  WHERE o.created_at < now() - p_attempts_older_than
                    AND o.state NOT IN ('REPLAYED', 'DISCARDED', 'RESCHEDULED')
                    AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
                    AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
                  LIMIT p_max_rows) x;
        END IF;
        v_attempts := outbox.forget_attempts(v_ids, v_message_ids);
    END IF;

    -- A dedupe key outlives its message by the retention window, counted
    -- from the message's terminal outcome (delivered or discarded), never
    -- from its enqueue: a message that waited longer than the window (its
    -- retries, AvailableAt, an outage) keeps its key for the whole window
    -- after it went. While the message is pending or dead, its key stays,
    -- and so does a key whose outcome is known nowhere (the archive has no
    -- terminal row and the key no settled_at: only a hand edit does that).
    -- The key's own age is a cheap first filter, since no message goes
    -- before it is enqueued.
    IF p_dedupe_older_than IS NOT NULL THEN
        DELETE FROM outbox.dedupe x
        WHERE x.ctid = ANY (ARRAY(
            SELECT k.ctid FROM outbox.dedupe k
            WHERE k.created_at < now() - p_dedupe_older_than
              -- The latest outcome known, in the key or in the archive
              -- (greatest ignores a NULL; two NULLs keep the key).
              AND greatest(k.settled_at,
                           (SELECT max(a.created_at) FROM outbox.attempts a
                            WHERE a.message_id = k.message_id AND a.state IN ('DISPATCHED', 'DISCARDED')))
                  < now() - p_dedupe_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = k.message_id OFFSET 0)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = k.message_id OFFSET 0)
            LIMIT p_max_rows));
        GET DIAGNOSTICS v_dedupe = ROW_COUNT;
    END IF;

    -- A key with nothing pending or dead, idle for the retention window,
    -- loses its bookkeeping (sequence allocator and key row). Its sequence
    -- ids must never go back if it comes back, so a key is forgotten only
    -- once outbox.sequence_floor (which new keys start above) covers it, and
    -- the floor is raised in an earlier pass than the one that forgets: a
    -- producer that read the old floor has committed or failed by then.
    IF p_keys_older_than IS NOT NULL THEN
        SELECT f.last_sequence_id INTO v_floor FROM outbox.sequence_floor f;
        WITH idle AS (
            SELECT s.namespace, s.ordering_key, s.last_sequence_id
            FROM outbox.sequences s
            WHERE s.updated_at < now() - p_keys_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p
                              WHERE p.namespace = s.namespace AND p.ordering_key = s.ordering_key)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d
                              WHERE d.namespace = s.namespace AND d.ordering_key = s.ordering_key)
              AND NOT EXISTS (SELECT 1 FROM outbox.unsettled_keys u
                              WHERE u.namespace = s.namespace AND u.ordering_key = s.ordering_key)
            ORDER BY s.updated_at
            LIMIT p_max_rows
            -- A producer enqueueing to the key right now holds its row.
            FOR UPDATE OF s SKIP LOCKED
        ),
        -- And whoever is settling it right now holds its key row.
        unlocked AS (
            SELECT k.namespace, k.ordering_key FROM outbox.keys k JOIN idle i USING (namespace, ordering_key)
            FOR UPDATE OF k SKIP LOCKED
        ),
        forgotten AS (
            DELETE FROM outbox.sequences s
            USING idle i
            WHERE s.namespace = i.namespace AND s.ordering_key = i.ordering_key AND i.last_sequence_id <= v_floor
              AND (EXISTS (SELECT 1 FROM unlocked u WHERE u.namespace = i.namespace AND u.ordering_key = i.ordering_key)
                   OR NOT EXISTS (SELECT 1 FROM outbox.keys k WHERE k.namespace = i.namespace AND k.ordering_key = i.ordering_key))
            RETURNING s.namespace, s.ordering_key
        ),
        unkeyed AS (
            DELETE FROM outbox.keys k USING forgotten f
            WHERE k.namespace = f.namespace AND k.ordering_key = f.ordering_key
        ),
        raised AS (
            UPDATE outbox.sequence_floor f
            SET last_sequence_id = (SELECT max(i.last_sequence_id) FROM idle i)
            WHERE (SELECT max(i.last_sequence_id) FROM idle i) > f.last_sequence_id
        )
        SELECT count(*) INTO v_keys FROM forgotten;
    END IF;

    -- Last, since each takes the archive's lock until the pass commits:
    -- the expired days go, and the days ahead are made (the reaper's passes
    -- keep them made; outbox.ensure_archive_partitions).
    IF p_attempts_older_than IS NOT NULL THEN
        v_attempts := v_attempts + outbox.drop_expired_archive_partitions(now() - p_attempts_older_than);
    END IF;
    PERFORM outbox.ensure_archive_partitions(3);

    RETURN QUERY SELECT v_attempts, v_dedupe, v_keys;
END;
$$;
REVOKE ALL ON FUNCTION outbox.purge(p_attempts_older_than interval, p_dedupe_older_than interval, p_max_rows integer, p_keys_older_than interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.purge(p_attempts_older_than interval, p_dedupe_older_than interval, p_max_rows integer, p_keys_older_than interval) TO outbox_dispatcher;
