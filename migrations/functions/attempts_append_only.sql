CREATE OR REPLACE FUNCTION outbox.attempts_append_only() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- outbox.purge() sets this transaction-local flag; no runtime role holds
    -- DELETE on the table, so only the owner's purge function can use it.
    IF TG_OP = 'DELETE' AND current_setting('outbox.purge_in_progress', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'outbox.attempts is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'P0001',
              HINT = 'Outcomes are recorded by the outbox functions; retention is outbox.purge().';
END;
$$;
REVOKE ALL ON FUNCTION outbox.attempts_append_only() FROM PUBLIC;
DROP TRIGGER IF EXISTS attempts_append_only ON outbox.attempts;
CREATE TRIGGER attempts_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON outbox.attempts FOR EACH STATEMENT EXECUTE FUNCTION outbox.attempts_append_only();
