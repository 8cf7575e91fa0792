-- pending_state names where a pending message stands, as
-- pending_messages() says it. Not executable by any runtime role.
CREATE OR REPLACE FUNCTION outbox.pending_state(p_lease_token uuid, p_lease_expires_at timestamptz, p_paused boolean,
                                     p_behind boolean, p_next_attempt_at timestamptz, p_last_error_code text,
                                     p_now timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN p_lease_token IS NOT NULL AND p_lease_expires_at <= p_now THEN 'lease_expired'
        WHEN p_lease_token IS NOT NULL THEN 'leased'
        WHEN p_paused THEN 'paused'
        WHEN p_behind THEN 'behind'
        WHEN p_next_attempt_at > p_now AND p_last_error_code IS NOT NULL THEN 'retrying'
        WHEN p_next_attempt_at > p_now THEN 'scheduled'
        ELSE 'due'
    END
$$;
REVOKE ALL ON FUNCTION outbox.pending_state(p_lease_token uuid, p_lease_expires_at timestamp with time zone, p_paused boolean, p_behind boolean, p_next_attempt_at timestamp with time zone, p_last_error_code text, p_now timestamp with time zone) FROM PUBLIC;
