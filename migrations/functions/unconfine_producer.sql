CREATE OR REPLACE FUNCTION outbox.unconfine_producer(
    p_role     name,
    p_operator text DEFAULT NULL,
    p_reason   text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- Lifts p_role's confinement: its members may enqueue into any namespace
-- again (unless another confined role holds them). Its namespace grants go
-- with it; returns how many there were. Recorded in outbox.operator_log,
-- with the namespaces the role had.
DECLARE
    v_namespaces text[];
    v_confined   boolean;
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'outbox.unconfine_producer: a reason is required; it is kept in outbox.operator_log' USING ERRCODE = '22023';
    END IF;
    DELETE FROM outbox.confined_producers c WHERE c.role_name = p_role;
    v_confined := FOUND;
    IF NOT v_confined THEN
        RAISE EXCEPTION 'outbox.unconfine_producer: role % is not confined', quote_ident(p_role)
            USING ERRCODE = 'P7005', HINT = 'outbox.confined_producers lists the confined roles.';
    END IF;
    WITH gone AS (
        DELETE FROM outbox.producer_namespaces g WHERE g.role_name = p_role RETURNING g.namespace
    )
    SELECT array_agg(gone.namespace ORDER BY gone.namespace) INTO v_namespaces FROM gone;
    PERFORM outbox.record_operator_action('unconfine_producer', p_role, p_operator, p_reason,
        jsonb_build_object('namespaces', coalesce(v_namespaces, '{}')));
    RETURN coalesce(cardinality(v_namespaces), 0);
END;
$$;
REVOKE ALL ON FUNCTION outbox.unconfine_producer(p_role name, p_operator text, p_reason text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.unconfine_producer(p_role name, p_operator text, p_reason text) TO outbox_operator;
