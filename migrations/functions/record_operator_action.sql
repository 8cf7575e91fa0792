-- record_operator_action appends to outbox.operator_log; the operator
-- functions call it as the owner, and no runtime role may.
CREATE OR REPLACE FUNCTION outbox.record_operator_action(
    p_action   text,
    p_subject  text,
    p_operator text,
    p_reason   text,
    p_details  jsonb)
RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO outbox.operator_log (action, subject, operator, reason, details)
    VALUES (p_action, p_subject, nullif(p_operator, ''), nullif(p_reason, ''), coalesce(p_details, '{}'::jsonb))
    RETURNING id;
$$;
REVOKE ALL ON FUNCTION outbox.record_operator_action(p_action text, p_subject text, p_operator text, p_reason text, p_details jsonb) FROM PUBLIC;
