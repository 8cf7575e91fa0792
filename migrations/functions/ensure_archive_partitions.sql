-- ensure_archive_partitions makes the archive's partitions for today and
-- the p_days_ahead days after it (UTC), those that do not exist yet, and
-- returns how many it made. A day's range is the UUIDv7 of its 00:00 to the
-- next day's (migrations/00014_partitioned_archive.sql). outbox.purge calls
-- it on every pass, so the reaper keeps days ahead; running it again, or
-- twice at once, makes nothing more.
--
-- A missing day never fails an insert: its rows go to the DEFAULT partition.
-- Such a day gets no partition later (making it would have to move them):
-- it stays in DEFAULT, which retention purges row by row. Making a
-- partition locks the archive for an instant, and reads DEFAULT (only the
-- few rows retention kept from dropped days) to prove none of its rows
-- belongs to the new day; a lock not had within lock_timeout leaves the day
-- for the next pass, which is why days are made ahead.
CREATE OR REPLACE FUNCTION outbox.ensure_archive_partitions(p_days_ahead int)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Behind a long reader of the archive, a waiting lock would queue every
-- completion behind it: give up quickly instead.
SET lock_timeout = '1s'
AS $$
DECLARE
    v_today   date := (now() AT TIME ZONE 'UTC')::date;
    v_day     date;
    v_name    text;
    v_lo      uuid;
    v_hi      uuid;
    v_made    int := 0;
BEGIN
    IF p_days_ahead IS NULL OR p_days_ahead < 0 OR p_days_ahead > 60 THEN
        RAISE EXCEPTION 'outbox.ensure_archive_partitions: p_days_ahead must be between 0 and 60, got %', p_days_ahead
            USING ERRCODE = '22023';
    END IF;
    -- One maker at a time (two would both find a day missing); whoever
    -- finds another at it leaves the days to it.
    IF NOT pg_try_advisory_xact_lock(hashtext('outbox'), hashtext('archive_partitions')) THEN
        RETURN 0;
    END IF;
    FOR v_day IN SELECT generate_series(v_today, v_today + p_days_ahead, interval '1 day')::date LOOP
        v_name := 'attempts_p' || to_char(v_day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass('outbox.' || v_name) IS NOT NULL;
        v_lo := (lpad(to_hex((extract(epoch FROM v_day::timestamp AT TIME ZONE 'UTC') * 1000)::bigint), 12, '0') || repeat('0', 20))::uuid;
        v_hi := (lpad(to_hex((extract(epoch FROM (v_day + 1)::timestamp AT TIME ZONE 'UTC') * 1000)::bigint), 12, '0') || repeat('0', 20))::uuid;
        IF EXISTS (SELECT 1 FROM outbox.attempts_default d WHERE d.message_id >= v_lo AND d.message_id < v_hi) THEN
            RAISE NOTICE 'outbox.ensure_archive_partitions: % has rows in the DEFAULT partition; it stays there', v_day;
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('CREATE TABLE outbox.%I PARTITION OF outbox.attempts FOR VALUES FROM (%L) TO (%L)', v_name, v_lo, v_hi);
            EXECUTE format('CREATE TRIGGER attempts_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON outbox.%I '
                           'FOR EACH STATEMENT EXECUTE FUNCTION outbox.attempts_append_only()', v_name);
            -- A second delivery is reported on the partition's index: its
            -- name ends as the parent's, which is how it is recognised.
            EXECUTE format('ALTER INDEX outbox.%I RENAME TO %I',
                (SELECT c.relname FROM pg_catalog.pg_index x
                 JOIN pg_catalog.pg_inherits i ON i.inhrelid = x.indexrelid
                 JOIN pg_catalog.pg_class c ON c.oid = x.indexrelid
                 WHERE x.indrelid = ('outbox.' || v_name)::regclass
                   AND i.inhparent = 'outbox.attempts_one_dispatched_per_message'::regclass),
                v_name || '_one_dispatched_per_message');
            v_made := v_made + 1;
        EXCEPTION
            WHEN lock_not_available THEN
                RAISE NOTICE 'outbox.ensure_archive_partitions: the archive is busy; % is left for the next pass', v_day;
            WHEN check_violation THEN
                -- A row of the day reached DEFAULT since the check above.
                RAISE NOTICE 'outbox.ensure_archive_partitions: % has rows in the DEFAULT partition; it stays there', v_day;
        END;
    END LOOP;
    RETURN v_made;
END;
$$;
REVOKE ALL ON FUNCTION outbox.ensure_archive_partitions(p_days_ahead integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.ensure_archive_partitions(p_days_ahead integer) TO outbox_dispatcher;
