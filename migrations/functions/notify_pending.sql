CREATE OR REPLACE FUNCTION outbox.notify_pending() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('outbox_pending', '');
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION outbox.notify_pending() IS 'Trigger: one NOTIFY outbox_pending per statement that inserts into outbox.pending (folded per transaction).';
REVOKE ALL ON FUNCTION outbox.notify_pending() FROM PUBLIC;
DROP TRIGGER IF EXISTS pending_notify ON outbox.pending;
CREATE TRIGGER pending_notify AFTER INSERT ON outbox.pending FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_pending();
