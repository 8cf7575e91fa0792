-- A producer settles the keys it enqueued to when it commits: a key that had
-- nothing pending gets its first message as its head. The trigger is on the
-- sequence allocator, so it fires once per key and statement, not once per
-- message. Deferred to commit, it holds the key's lock for that instant only;
-- under SET CONSTRAINTS ALL IMMEDIATE it holds it until commit, and
-- dispatchers, which never wait for it, leave the key to the next claim.
CREATE OR REPLACE FUNCTION outbox.sequences_settle_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM outbox.settle_keys(ARRAY[NEW.namespace], ARRAY[NEW.ordering_key], true);
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION outbox.sequences_settle_at_commit() FROM PUBLIC;
DROP TRIGGER IF EXISTS sequences_settle_at_commit ON outbox.sequences;
CREATE CONSTRAINT TRIGGER sequences_settle_at_commit AFTER INSERT OR UPDATE ON outbox.sequences DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION outbox.sequences_settle_at_commit();
