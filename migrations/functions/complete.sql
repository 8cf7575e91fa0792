CREATE OR REPLACE FUNCTION outbox.complete(
    p_worker_id     text,
    p_id            uuid,
    p_lease_token   uuid,
    p_outcome       text,
    p_error_code    text DEFAULT NULL,
    p_error_message text DEFAULT NULL,
    p_target        text DEFAULT NULL,
    p_target_ref    text DEFAULT NULL,
    p_latency_ms    int DEFAULT NULL,
    p_retry_at      timestamptz DEFAULT NULL,
    p_max_attempts  int DEFAULT 100)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status text;
BEGIN
    SELECT c.status INTO v_status
    FROM outbox.complete_batch(
        p_worker_id,
        jsonb_build_array(jsonb_build_object(
            'id', p_id, 'lease_token', p_lease_token, 'outcome', p_outcome,
            'error_code', p_error_code, 'error_message', p_error_message,
            'target', p_target, 'target_ref', p_target_ref,
            'latency_ms', p_latency_ms, 'retry_at', p_retry_at)),
        p_max_attempts) AS c;
    IF v_status = 'lease_lost' THEN
        RAISE EXCEPTION 'LEASE_LOST: message % is no longer leased to % under that token', p_id, p_worker_id
            USING ERRCODE = 'P7002';
    END IF;
    RETURN v_status;
END;
$$;
REVOKE ALL ON FUNCTION outbox.complete(p_worker_id text, p_id uuid, p_lease_token uuid, p_outcome text, p_error_code text, p_error_message text, p_target text, p_target_ref text, p_latency_ms integer, p_retry_at timestamp with time zone, p_max_attempts integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.complete(p_worker_id text, p_id uuid, p_lease_token uuid, p_outcome text, p_error_code text, p_error_message text, p_target text, p_target_ref text, p_latency_ms integer, p_retry_at timestamp with time zone, p_max_attempts integer) TO outbox_dispatcher;
