CREATE OR REPLACE FUNCTION outbox.attempts_append_only() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- outbox.purge() sets this transaction-local flag; no runtime role holds
    -- DELETE on the table or its partitions, so only the owner's purge
    -- function can use it.
    IF TG_OP = 'DELETE' AND current_setting('outbox.purge_in_progress', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'outbox.attempts is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'P0001',
              HINT = 'Outcomes are recorded by the outbox functions; retention is outbox.purge().';
END;
$$;
REVOKE ALL ON FUNCTION outbox.attempts_append_only() FROM PUBLIC;
-- On the archive and on each of its partitions: a statement on a partition
-- fires that partition's statement triggers, not the parent's.
-- outbox.ensure_archive_partitions puts it on each partition it makes.
DO $$
DECLARE
    v_table regclass;
BEGIN
    FOR v_table IN SELECT 'outbox.attempts'::regclass
                   UNION ALL SELECT i.inhrelid::regclass FROM pg_catalog.pg_inherits i WHERE i.inhparent = 'outbox.attempts'::regclass LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS attempts_append_only ON %s', v_table);
        EXECUTE format('CREATE TRIGGER attempts_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION outbox.attempts_append_only()', v_table);
    END LOOP;
END;
$$;
