CREATE OR REPLACE FUNCTION outbox.purge_audit(
    p_older_than interval,
    p_max_rows   int,
    p_operator   text DEFAULT NULL,
    p_reason     text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Operators' actions in the archive (REPLAYED, DISCARDED, RESCHEDULED) older than
-- p_older_than, of messages no longer pending or dead: the audit trail,
-- which outbox.purge leaves alone and only an operator may shorten. The
-- purge itself is recorded in outbox.operator_log, which nothing shortens.
DECLARE
    v_n           bigint;
    v_ids         bigint[];
    v_message_ids uuid[];
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '1 day' THEN
        RAISE EXCEPTION 'outbox.purge_audit: the audit trail is kept at least 1 day, got %', p_older_than
            USING ERRCODE = '22023';
    END IF;
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge_audit: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    -- One retention pass at a time: see outbox.purge.
    PERFORM pg_advisory_xact_lock(hashtext('outbox'), hashtext('purge'));
    SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.message_id), '{}') INTO v_ids, v_message_ids
    FROM (SELECT o.id, o.message_id FROM outbox.attempts o
          WHERE o.created_at < now() - p_older_than
            AND o.state IN ('REPLAYED', 'DISCARDED', 'RESCHEDULED')
            AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
            AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
          LIMIT p_max_rows) x;
    v_n := outbox.forget_attempts(v_ids, v_message_ids);
    PERFORM outbox.record_operator_action('purge_audit', 'outbox.attempts', p_operator, p_reason,
        jsonb_build_object('older_than', p_older_than::text, 'max_rows', p_max_rows, 'purged', v_n));
    RETURN v_n;
END;
$$;
REVOKE ALL ON FUNCTION outbox.purge_audit(p_older_than interval, p_max_rows integer, p_operator text, p_reason text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.purge_audit(p_older_than interval, p_max_rows integer, p_operator text, p_reason text) TO outbox_operator;
