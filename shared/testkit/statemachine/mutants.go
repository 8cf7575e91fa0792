package statemachine

// Deliberately broken functions, for showing that the harness catches what
// they break (Config.Prepare with PrepareSQL, or cmd/statemachine -mutant).
// Each replaces a function of the outbox with the same signature, owner
// and grants.
var Mutants = map[string]string{
	// pause records the operator's action and pauses nothing: claims must
	// then return messages of what the operator paused (invariant 3).
	"pause-records-only": `
CREATE OR REPLACE FUNCTION outbox.pause(
    p_namespace text,
    p_topic     text DEFAULT NULL,
    p_operator  text DEFAULT NULL,
    p_reason    text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM outbox.record_operator_action('pause', p_namespace || '/' || coalesce(nullif(p_topic, ''), '*'),
                                          p_operator, p_reason, '{}'::jsonb);
    RETURN 0;
END;
$$;`,

	// complete_batch without a fence: before the real one runs, every
	// named row that is leased is leased again to the caller, under the
	// caller's token, for a minute. A completion sent after its lease
	// expired, or after another worker took the message, then writes
	// (invariant 1).
	"complete-without-fence": `
ALTER FUNCTION outbox.complete_batch(text, jsonb, integer, boolean, uuid[], uuid[], text[], text[], text[], text[], text[],
                                     integer[], timestamptz[], text[], boolean[])
    RENAME TO complete_batch_fenced;
CREATE FUNCTION outbox.complete_batch(
    p_worker_id      text,
    p_results        jsonb,
    p_max_attempts   int DEFAULT 100,
    p_omit_ok        boolean DEFAULT false,
    p_ids            uuid[] DEFAULT NULL,
    p_lease_tokens   uuid[] DEFAULT NULL,
    p_outcomes       text[] DEFAULT NULL,
    p_error_codes    text[] DEFAULT NULL,
    p_error_messages text[] DEFAULT NULL,
    p_targets        text[] DEFAULT NULL,
    p_target_refs    text[] DEFAULT NULL,
    p_latencies_ms   int[] DEFAULT NULL,
    p_retry_at       timestamptz[] DEFAULT NULL,
    p_on_dead        text[] DEFAULT NULL,
    p_hold           boolean[] DEFAULT NULL)
RETURNS TABLE(id uuid, status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE outbox.pending p
    SET claimed_by = p_worker_id, lease_token = r.token, lease_expires_at = clock_timestamp() + interval '1 minute'
    FROM unnest(p_ids, p_lease_tokens) AS r(id, token)
    WHERE p.lease_token IS NOT NULL AND p.id = r.id;
    RETURN QUERY SELECT * FROM outbox.complete_batch_fenced(p_worker_id, p_results, p_max_attempts, p_omit_ok, p_ids,
        p_lease_tokens, p_outcomes, p_error_codes, p_error_messages, p_targets, p_target_refs, p_latencies_ms,
        p_retry_at, p_on_dead, p_hold);
END;
$$;
ALTER FUNCTION outbox.complete_batch(text, jsonb, integer, boolean, uuid[], uuid[], text[], text[], text[], text[], text[],
                                     integer[], timestamptz[], text[], boolean[]) OWNER TO outbox_owner;
GRANT EXECUTE ON FUNCTION outbox.complete_batch(text, jsonb, integer, boolean, uuid[], uuid[], text[], text[], text[], text[],
                                                text[], integer[], timestamptz[], text[], boolean[]) TO outbox_dispatcher;`,
}
