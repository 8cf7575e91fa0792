-- A dedicated owner for schema outbox. Until now the schema, its tables and
-- its SECURITY DEFINER functions belonged to whoever ran the migrations —
-- often a superuser — so every function ran with a superuser's powers. They
-- now belong to outbox_owner, a NOLOGIN role with no privilege beyond its
-- own objects: a flaw in a function can do no more than the schema allows.
--
-- Functions outbox_owner creates are not executable by PUBLIC (its default
-- privileges say so), so a function a later migration adds is closed until
-- it is granted. Later migrations run their DDL as the owner:
--
--     SET LOCAL ROLE outbox_owner;
--
-- at their top (goose runs each in one transaction); statements that manage
-- roles (CREATE ROLE, GRANT role) stay with the migrating login. The
-- migrating login must be a superuser or have CREATEROLE (RDS's master user
-- has): it is made a member of outbox_owner so that it may act as it.

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'outbox_owner') THEN
        BEGIN
            CREATE ROLE outbox_owner NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- created by a concurrent migration of another database
        END;
    END IF;
    IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT outbox_owner TO %I', current_user);
    END IF;
END;
$$;
-- +goose StatementEnd

-- The owner may create in its schema (for later migrations run as it).
ALTER SCHEMA outbox OWNER TO outbox_owner;

-- +goose StatementBegin
DO $$
DECLARE
    v_obj record;
BEGIN
    FOR v_obj IN
        SELECT format('ALTER TABLE %s OWNER TO outbox_owner', c.oid::regclass) AS stmt
        FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'p')
        UNION ALL
        SELECT format('ALTER FUNCTION %s OWNER TO outbox_owner', p.oid::regprocedure)
        FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'outbox'
    LOOP
        EXECUTE v_obj.stmt;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- Functions the owner creates from now on are closed to PUBLIC. (Per-schema
-- default privileges can only add to the global ones, so this is the
-- owner's global default: it creates nothing outside schema outbox.)
ALTER DEFAULT PRIVILEGES FOR ROLE outbox_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- Later migrations record themselves in the version table as the owner.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('public.outbox_schema_migrations') IS NOT NULL THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON public.outbox_schema_migrations TO outbox_owner;
        IF pg_catalog.pg_get_serial_sequence('public.outbox_schema_migrations', 'id') IS NOT NULL THEN
            EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %s TO outbox_owner',
                           pg_catalog.pg_get_serial_sequence('public.outbox_schema_migrations', 'id'));
        END IF;
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose Down
ALTER DEFAULT PRIVILEGES FOR ROLE outbox_owner GRANT EXECUTE ON FUNCTIONS TO PUBLIC;
-- +goose StatementBegin
DO $$
DECLARE
    v_obj record;
BEGIN
    FOR v_obj IN
        SELECT format('ALTER TABLE %s OWNER TO %I', c.oid::regclass, current_user) AS stmt
        FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'p')
        UNION ALL
        SELECT format('ALTER FUNCTION %s OWNER TO %I', p.oid::regprocedure, current_user)
        FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'outbox'
    LOOP
        EXECUTE v_obj.stmt;
    END LOOP;
    EXECUTE format('ALTER SCHEMA outbox OWNER TO %I', current_user);
    IF to_regclass('public.outbox_schema_migrations') IS NOT NULL THEN
        REVOKE ALL ON public.outbox_schema_migrations FROM outbox_owner;
        IF pg_catalog.pg_get_serial_sequence('public.outbox_schema_migrations', 'id') IS NOT NULL THEN
            EXECUTE format('REVOKE ALL ON SEQUENCE %s FROM outbox_owner',
                           pg_catalog.pg_get_serial_sequence('public.outbox_schema_migrations', 'id'));
        END IF;
    END IF;
    BEGIN
        DROP ROLE IF EXISTS outbox_owner;
    EXCEPTION WHEN dependent_objects_still_exist OR internal_error THEN
        -- It owns the outbox of another database of this cluster: leave it.
        RAISE NOTICE 'role outbox_owner is still in use elsewhere; not dropped';
    END;
END;
$$;
-- +goose StatementEnd
