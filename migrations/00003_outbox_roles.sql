-- Least-privilege roles. They are NOLOGIN: a deployment grants them to its
-- login users (GRANT outbox_dispatcher TO dispatch_lambda). No runtime role
-- may write a table directly; every write goes through the functions.
--
--   outbox_producer    enqueue only
--   outbox_dispatcher  claim, complete, repair, purge, stats
--   outbox_operator    replay dead letters, stats, read the tables
--   outbox_reader      stats, read the tables
--
-- Roles are cluster-wide while this migration runs per database, so they are
-- created only when missing (and a concurrent creator is tolerated).

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['outbox_producer', 'outbox_dispatcher', 'outbox_operator', 'outbox_reader'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created by a concurrent migration of another database
            END;
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- Functions are executable by PUBLIC unless revoked; the state machine is not.
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;

GRANT USAGE ON SCHEMA outbox TO outbox_producer, outbox_dispatcher, outbox_operator, outbox_reader;

GRANT EXECUTE ON FUNCTION
    outbox.enqueue(text, text, jsonb, text, text, text, jsonb, text, timestamptz),
    outbox.enqueue_batch(text[], text[], text[], text[], text[], text[], text[], text[], timestamptz[])
TO outbox_producer;

GRANT EXECUTE ON FUNCTION
    outbox.claim_batch(int, text, int, text[]),
    outbox.complete_batch(text, jsonb, int),
    outbox.complete(text, uuid, uuid, text, text, text, text, text, int, timestamptz, int),
    outbox.repair_expired_leases(int, text, int),
    outbox.purge(interval, interval, int),
    outbox.stats()
TO outbox_dispatcher;

GRANT EXECUTE ON FUNCTION
    outbox.replay_dead(uuid[], text, text, text, timestamptz, timestamptz, int, boolean, text, text),
    outbox.stats()
TO outbox_operator;
GRANT SELECT ON outbox.pending, outbox.attempts, outbox.dead TO outbox_operator;

GRANT EXECUTE ON FUNCTION outbox.stats() TO outbox_reader;
GRANT SELECT ON outbox.pending, outbox.attempts, outbox.dead TO outbox_reader;

-- +goose Down
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM outbox_producer, outbox_dispatcher, outbox_operator, outbox_reader;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM outbox_producer, outbox_dispatcher, outbox_operator, outbox_reader;
REVOKE ALL ON SCHEMA outbox FROM outbox_producer, outbox_dispatcher, outbox_operator, outbox_reader;
-- +goose StatementBegin
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['outbox_producer', 'outbox_dispatcher', 'outbox_operator', 'outbox_reader'] LOOP
        BEGIN
            EXECUTE format('DROP ROLE IF EXISTS %I', v_role);
        EXCEPTION WHEN dependent_objects_still_exist THEN
            -- Still granted in another database of this cluster, or to a
            -- login user: leave the role for that database's own down
            -- migration or for the administrator.
            RAISE NOTICE 'role % is still in use elsewhere; not dropped', v_role;
        WHEN internal_error THEN
            -- DROP ROLE first lists what depends on the role across the
            -- cluster; a database dropped at that moment makes the listing
            -- fail ("cache lookup failed for database"). The role may still
            -- be in use, as above: leave it.
            RAISE NOTICE 'role % not dropped: %', v_role, SQLERRM;
        END;
    END LOOP;
END;
$$;
-- +goose StatementEnd
