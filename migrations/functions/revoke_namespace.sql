CREATE OR REPLACE FUNCTION outbox.revoke_namespace(
    p_role      name,
    p_namespace text,
    p_operator  text DEFAULT NULL,
    p_reason    text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- Takes a namespace back from p_role. A role left with none stays confined,
-- to no namespace: its members may enqueue nowhere until an operator grants
-- one (outbox.grant_namespace) or lifts the confinement
-- (outbox.unconfine_producer). Returns whether the grant existed. The
-- grant's row goes; outbox.operator_log keeps who revoked it, and who had
-- granted it when.
DECLARE
    v_grant outbox.producer_namespaces;
BEGIN
    DELETE FROM outbox.producer_namespaces g WHERE g.role_name = p_role AND g.namespace = p_namespace
    RETURNING g.* INTO v_grant;
    PERFORM outbox.record_operator_action('revoke_namespace', p_role, p_operator, p_reason,
        jsonb_strip_nulls(jsonb_build_object('namespace', p_namespace, 'existed', v_grant.role_name IS NOT NULL,
                                             'granted_by', v_grant.granted_by, 'granted_at', v_grant.granted_at)));
    RETURN v_grant.role_name IS NOT NULL;
END;
$$;
REVOKE ALL ON FUNCTION outbox.revoke_namespace(p_role name, p_namespace text, p_operator text, p_reason text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.revoke_namespace(p_role name, p_namespace text, p_operator text, p_reason text) TO outbox_operator;
