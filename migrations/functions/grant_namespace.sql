CREATE OR REPLACE FUNCTION outbox.grant_namespace(
    p_role      name,
    p_namespace text,
    p_operator  text DEFAULT NULL,
    p_reason    text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- Confines p_role's members to the namespaces granted to it (this one and
-- any others): from their next enqueue, any other namespace is refused.
-- The role stays confined until outbox.unconfine_producer, even when every
-- namespace is revoked. Recorded in outbox.operator_log, a grant that
-- already existed too.
DECLARE
    v_new boolean;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_role) THEN
        RAISE EXCEPTION 'outbox.grant_namespace: role % does not exist', quote_ident(p_role) USING ERRCODE = '22023';
    END IF;
    IF p_namespace IS NULL OR NOT outbox.valid_name(p_namespace) THEN
        RAISE EXCEPTION 'outbox.grant_namespace: % is not a namespace (1-128 characters of letters, digits and . _ : / -, starting with a letter or digit)',
            quote_literal(p_namespace) USING ERRCODE = '22023';
    END IF;
    INSERT INTO outbox.confined_producers (role_name) VALUES (p_role)
    ON CONFLICT (role_name) DO NOTHING;
    INSERT INTO outbox.producer_namespaces (role_name, namespace) VALUES (p_role, p_namespace)
    ON CONFLICT ON CONSTRAINT producer_namespaces_pkey DO NOTHING;
    v_new := FOUND;
    PERFORM outbox.record_operator_action('grant_namespace', p_role, p_operator, p_reason,
        jsonb_build_object('namespace', p_namespace, 'new', v_new));
END;
$$;
REVOKE ALL ON FUNCTION outbox.grant_namespace(p_role name, p_namespace text, p_operator text, p_reason text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.grant_namespace(p_role name, p_namespace text, p_operator text, p_reason text) TO outbox_operator;
