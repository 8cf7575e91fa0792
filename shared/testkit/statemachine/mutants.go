package statemachine

import (
	"fmt"

	"github.com/outboxkit/dispatcher/migrations"
)

// BrokenFence is complete_batch as the migrator builds it, with a lease
// fence that checks a lease is live but not whose it is (neither the
// worker nor the token): any worker may then record outcomes for rows
// another worker holds (invariant 1). It is the real function with one
// fragment swapped, so it shows that the harness catches a broken fence,
// not a hand-written stand-in.
func BrokenFence() (string, error) {
	sql, err := migrations.FunctionSQL("complete_batch", map[string]string{"lease_fence": `(p.lease_expires_at > v_now
 OR p.lease_token IS NULL
    AND EXISTS (SELECT 1 FROM outbox.pending h
                WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key AND NOT h.behind
                  AND h.sequence_id < p.sequence_id AND h.run_through >= p.sequence_id
                  AND h.lease_expires_at > v_now))`})
	if err != nil {
		return "", fmt.Errorf("statemachine: build the broken fence: %w", err)
	}
	return "SET ROLE outbox_owner; SET check_function_bodies = off;\n" + sql + "\nRESET ROLE;", nil
}

// Deliberately broken functions, for showing that the harness catches what
// they break (Config.Prepare with PrepareSQL, or
// shared/testkit/statemachine/cmd/statemachine -mutant).
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
