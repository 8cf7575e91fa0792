CREATE OR REPLACE FUNCTION outbox.enqueue(
    p_namespace    text,
    p_topic        text,
    p_payload      jsonb,
    p_tenant_id    text DEFAULT NULL,
    p_dedupe_key   text DEFAULT NULL,
    p_ordering_key text DEFAULT NULL,
    p_headers      jsonb DEFAULT '{}',
    p_trace_header text DEFAULT NULL,
    p_available_at timestamptz DEFAULT now())
RETURNS TABLE(message_id uuid, sequence_id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- One message: enqueue_batch() of a batch of one.
DECLARE
    -- While this is on, enqueue_batch's errors name outbox.enqueue and
    -- message index -1, as enqueue's always have. A setting rather than a
    -- parameter leaves enqueue_batch's signature the contract's. It is set
    -- here, not in a SET clause: only a superuser may create a function
    -- with a SET clause on a setting no extension defines, and RDS's master
    -- user is none. An error leaves it on only in a transaction or
    -- savepoint that is aborted, which resets it. Set by assignment: a
    -- PERFORM is a query, dearer.
    v_single text := set_config('outbox.enqueue_single', 'on', true);
    -- What enqueue_batch refuses of a document that would take too long to
    -- write out as text (see payload_problem), refused before it is.
    v_problem text := outbox.payload_problem(p_payload);
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'outbox.enqueue: invalid message: payload %', v_problem
            USING ERRCODE = 'P7004', COLUMN = 'payload', DETAIL = 'message index: -1';
    END IF;
    RETURN QUERY
    SELECT b.message_id, b.sequence_id, b.inserted
    FROM outbox.enqueue_batch(ARRAY[p_namespace], ARRAY[p_topic], ARRAY[p_payload::text],
                              ARRAY[p_tenant_id], ARRAY[p_dedupe_key], ARRAY[p_ordering_key],
                              ARRAY[p_headers::text], ARRAY[p_trace_header], ARRAY[p_available_at]) b;
    v_single := set_config('outbox.enqueue_single', 'off', true);
END;
$$;
REVOKE ALL ON FUNCTION outbox.enqueue(p_namespace text, p_topic text, p_payload jsonb, p_tenant_id text, p_dedupe_key text, p_ordering_key text, p_headers jsonb, p_trace_header text, p_available_at timestamp with time zone) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.enqueue(p_namespace text, p_topic text, p_payload jsonb, p_tenant_id text, p_dedupe_key text, p_ordering_key text, p_headers jsonb, p_trace_header text, p_available_at timestamp with time zone) TO outbox_producer;
