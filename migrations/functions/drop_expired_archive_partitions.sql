-- drop_expired_archive_partitions takes out of the archive each day that
-- lies wholly before p_cutoff (its last message was made before it), in one
-- statement instead of a delete per row, and returns how many archived rows
-- went (a day's row count is the planner's estimate, pg_class.reltuples,
-- which autovacuum keeps; a day never analysed is counted).
--
-- What retention keeps of a day is moved out first: the attempts made
-- since the cutoff (a message made that day may be attempted days later),
-- operators' actions (only outbox.purge_audit takes them), and the history
-- of messages still pending or dead. They are found by index, not by
-- reading the day, and land in the DEFAULT partition, since no range covers
-- the day any more; DEFAULT is purged row by row. A delivered message whose
-- dedupe key is still kept moves its outcome's time into the key
-- (settled_at), as forget_attempts does for a row.
--
-- Detaching takes the archive's lock for an instant; behind a long reader
-- it gives up after lock_timeout and leaves the day to the next pass
-- (outbox.purge calls this last, so the lock is held only until its end).
-- The detached day is not dropped in the same pass: PostgreSQL truncates a
-- dropped table's files at commit, before it lets its locks go, which
-- takes time in proportion to the day's size (149 ms for 546 MB) and would
-- hold the archive's lock as long. It is renamed attempts_expired_YYYYMMDD,
-- outside the archive, and the next pass drops it first and detaches
-- nothing more, so that its commit holds no lock of the archive.
-- Not executable by any runtime role; outbox.purge calls it under its lock.
CREATE OR REPLACE FUNCTION outbox.drop_expired_archive_partitions(p_cutoff timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '1s'
SET jit = off
AS $$
DECLARE
    v_day    record;
    v_rows   bigint;
    v_kept   bigint;
    v_purged bigint := 0;
    v_expired regclass;
    v_dropped boolean := false;
BEGIN
    FOR v_expired IN
        SELECT c.oid::regclass FROM pg_catalog.pg_class c
        WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'r' AND c.relname LIKE 'attempts\_expired\_%'
    LOOP
        EXECUTE format('DROP TABLE %s', v_expired);
        v_dropped := true;
    END LOOP;
    IF v_dropped THEN
        RETURN 0;
    END IF;

    FOR v_day IN
        SELECT c.oid::regclass AS part, c.reltuples, b[1]::uuid AS lo, b[2]::uuid AS hi
        FROM pg_catalog.pg_inherits i
        JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
        CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                        'FROM \(''([0-9a-f-]+)''\) TO \(''([0-9a-f-]+)''\)') b
        WHERE i.inhparent = 'outbox.attempts'::regclass AND b IS NOT NULL
        ORDER BY 3
    LOOP
        -- The upper bound's time: its top 48 bits, in Unix milliseconds.
        EXIT WHEN to_timestamp(('x' || substr(replace(v_day.hi::text, '-', ''), 1, 12))::bit(48)::bigint / 1000.0) > p_cutoff;
        BEGIN
            EXECUTE format('ALTER TABLE outbox.attempts DETACH PARTITION %s', v_day.part);

            EXECUTE format($q$
                INSERT INTO outbox.attempts OVERRIDING SYSTEM VALUE
                SELECT a.* FROM %1$s a WHERE a.created_at >= $1
                UNION
                SELECT a.* FROM %1$s a WHERE a.state IN ('REPLAYED', 'DISCARDED', 'RESCHEDULED')
                UNION
                SELECT a.* FROM %1$s a
                WHERE a.message_id IN (SELECT p.id FROM outbox.pending p WHERE p.id >= $2 AND p.id < $3)
                UNION
                SELECT a.* FROM %1$s a
                WHERE a.message_id IN (SELECT d.id FROM outbox.dead d WHERE d.id >= $2 AND d.id < $3)$q$,
                v_day.part) USING p_cutoff, v_day.lo, v_day.hi;
            GET DIAGNOSTICS v_kept = ROW_COUNT;

            -- The day's keys still kept, by message id; a DISCARDED outcome
            -- is an operator's and was kept above, so only deliveries move.
            EXECUTE format($q$
                WITH outcomes AS (
                    SELECT k.namespace, k.topic, k.dedupe_key, max(a.created_at) AS at
                    FROM outbox.dedupe k
                    JOIN %1$s a ON a.message_id = k.message_id AND a.namespace = k.namespace
                               AND a.topic = k.topic AND a.dedupe_key = k.dedupe_key
                    WHERE k.message_id >= $2 AND k.message_id < $3
                      AND a.state = 'DISPATCHED' AND a.created_at < $1
                      AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = a.message_id)
                      AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = a.message_id)
                    GROUP BY k.namespace, k.topic, k.dedupe_key
                )
                UPDATE outbox.dedupe k SET settled_at = greatest(k.settled_at, o.at)
                FROM outcomes o
                WHERE k.namespace = o.namespace AND k.topic = o.topic AND k.dedupe_key = o.dedupe_key$q$,
                v_day.part) USING p_cutoff, v_day.lo, v_day.hi;

            IF v_day.reltuples >= 0 THEN
                v_rows := v_day.reltuples::bigint;
            ELSE
                EXECUTE format('SELECT count(*) FROM %s', v_day.part) INTO v_rows;
            END IF;
            EXECUTE format('ALTER TABLE %s RENAME TO %I', v_day.part,
                           replace((SELECT c.relname FROM pg_catalog.pg_class c WHERE c.oid = v_day.part), 'attempts_p', 'attempts_expired_'));
            v_purged := v_purged + greatest(v_rows - v_kept, 0);
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            RAISE NOTICE 'outbox.purge: the archive is busy; % is left for the next pass', v_day.part;
            EXIT;
        END;
    END LOOP;
    RETURN v_purged;
END;
$$;
REVOKE ALL ON FUNCTION outbox.drop_expired_archive_partitions(p_cutoff timestamp with time zone) FROM PUBLIC;
