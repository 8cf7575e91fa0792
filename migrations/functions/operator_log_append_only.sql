CREATE OR REPLACE FUNCTION outbox.operator_log_append_only() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'outbox.operator_log is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'P0001',
              HINT = 'Operator actions are recorded by the outbox functions, and kept.';
END;
$$;
REVOKE ALL ON FUNCTION outbox.operator_log_append_only() FROM PUBLIC;
DROP TRIGGER IF EXISTS operator_log_append_only ON outbox.operator_log;
CREATE TRIGGER operator_log_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON outbox.operator_log FOR EACH STATEMENT EXECUTE FUNCTION outbox.operator_log_append_only();
