-- The outbox schema: tables, indexes, roles and grants. The functions that
-- are the only legal writers live in migrations/functions/, one file each,
-- applied after the versioned migrations (see embed.go); docs/DATABASE.md
-- describes the state machine they implement.
--
-- This baseline replaces the pre-release migrations 00001-00011. The next
-- versioned migration is 00012: a database that records any of 00002-00011
-- was built by a pre-release build, and the migrator refuses it.
--
--   pending            the hot, leased queue
--   attempts           append-only archive, one row per outcome
--   dead               dead letters
--   dedupe             (namespace, topic, dedupe_key) -> message, for idempotent enqueue
--   sequences          per-key sequence allocator (its row lock orders a key's producers)
--   sequence_floor     where a key new to sequences starts
--   keys               one row per ordering key: the lock of whoever changes its head
--   unsettled_keys     keys a dispatcher could not settle without waiting
--   paused             paused namespaces and topics
--   limits             what every producer is held to
--   producer_namespaces, confined_producers   namespaces as a security boundary
--   operator_log       append-only log of operator actions beyond single messages

-- +goose Up

-- Roles are cluster-wide while this migration runs per database, so they are
-- created only when missing (and a concurrent creator is tolerated). They are
-- NOLOGIN: a deployment grants them to its login users.
--
--   outbox_producer    enqueue only
--   outbox_dispatcher  claim, complete, repair, purge, stats
--   outbox_operator    replay, discard, pause, grants; read the tables
--   outbox_reader      stats; read the tables
--   outbox_owner       owns schema outbox and runs its SECURITY DEFINER
--                      functions: no privilege beyond its own objects
--
-- The migrating login must be a superuser or have CREATEROLE (RDS's master
-- user has): it is made a member of outbox_owner so that it may act as it.
-- +goose StatementBegin
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['outbox_producer', 'outbox_dispatcher', 'outbox_operator', 'outbox_reader', 'outbox_owner'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created by a concurrent migration of another database
            END;
        END IF;
    END LOOP;
    IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT outbox_owner TO %I', current_user);
    END IF;
END;
$$;
-- +goose StatementEnd

CREATE SCHEMA outbox;
ALTER SCHEMA outbox OWNER TO outbox_owner;
COMMENT ON SCHEMA outbox IS 'Transactional outbox: write through outbox.enqueue() in your own transaction; dispatchers use the other functions.';

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

-- Everything below belongs to outbox_owner. Functions it creates are closed
-- to PUBLIC (its default privileges; per-schema defaults can only add to the
-- global ones, so this is the owner's global default: it creates nothing
-- outside schema outbox).
SET LOCAL ROLE outbox_owner;
ALTER DEFAULT PRIVILEGES FOR ROLE outbox_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- The hot queue. A row is a message not yet delivered or dead; while a
-- dispatcher works on it, it is leased (claimed_by, lease_token,
-- lease_expires_at). An ordered message (ordering_key set) is its key's head
-- (behind = false) or waits behind it; a claim leases a head together with up
-- to a run of the messages behind it, recording the run's extent in the head's
-- run_through.
CREATE TABLE outbox.pending (
    id               uuid        PRIMARY KEY,
    namespace        text        NOT NULL,
    topic            text        NOT NULL,
    tenant_id        text,
    dedupe_key       text,
    ordering_key     text,
    sequence_id      bigint,
    payload          jsonb       NOT NULL,
    -- The payload's size as PostgreSQL returns it (its jsonb text), so that
    -- a claim bounds its memory without reading payloads.
    payload_bytes    integer     NOT NULL,
    headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    trace_header     text,
    attempt_count    integer     NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_error_code  text,
    last_error       text,
    failing_since    timestamptz,
    claimed_by       text,
    lease_token      uuid,
    lease_expires_at timestamptz,
    run_through      bigint,
    behind           boolean     NOT NULL DEFAULT false,
    park_on_dead     boolean     NOT NULL DEFAULT false,
    paused           boolean     NOT NULL DEFAULT false,
    CONSTRAINT pending_lease_all_or_none CHECK (
        (claimed_by IS NULL AND lease_token IS NULL AND lease_expires_at IS NULL)
        OR (claimed_by IS NOT NULL AND lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT pending_ordering_key_has_sequence CHECK ((ordering_key IS NULL) = (sequence_id IS NULL)),
    -- enqueue checks the character set; here only the length, which costs
    -- an insert nothing measurable.
    CONSTRAINT pending_namespace_length CHECK (octet_length(namespace) BETWEEN 1 AND 128),
    CONSTRAINT pending_topic_length CHECK (octet_length(topic) BETWEEN 1 AND 128),
    CONSTRAINT pending_payload_is_document CHECK (jsonb_typeof(payload) IN ('object', 'array')),
    CONSTRAINT pending_headers_is_object CHECK (jsonb_typeof(headers) = 'object'),
    CONSTRAINT pending_attempt_count_nonnegative CHECK (attempt_count >= 0),
    CONSTRAINT pending_behind_is_ordered CHECK (NOT behind OR ordering_key IS NOT NULL),
    CONSTRAINT pending_run_through_is_a_leased_run CHECK (run_through IS NULL OR (lease_token IS NOT NULL AND run_through > sequence_id))
) WITH (
    -- Free space on each page lets claim and retry updates stay on the page.
    fillfactor = 80,
    -- A queue: rows are inserted, updated a few times and deleted. Vacuum
    -- after a fixed number of dead rows rather than a fraction of a table
    -- whose size swings by orders of magnitude, and without cost-based
    -- sleeping, so that dead index entries do not pile up in front of the
    -- claim scan.
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0
);
COMMENT ON TABLE outbox.pending IS 'Hot queue of undelivered messages; a row is leased while a dispatcher works on it.';
COMMENT ON COLUMN outbox.pending.behind IS 'true: an earlier message of the same (namespace, ordering_key) is still to go first; not claimable.';
COMMENT ON COLUMN outbox.pending.failing_since IS 'When the message first failed retryably; a head failing since then blocks its key.';
COMMENT ON COLUMN outbox.pending.park_on_dead IS 'The route''s on_dead policy as the dispatcher last reported it: true parks the key if the message dies.';
COMMENT ON COLUMN outbox.pending.paused IS 'true: its namespace or topic is paused (outbox.paused); out of the claim index until resumed.';
COMMENT ON COLUMN outbox.pending.run_through IS 'On a leased ordered head: the last sequence_id of the run leased with it. The messages of the key after the head up to it are leased with the head (its token, holder and expiry) without a lease of their own.';

-- The claim scan: due, unleased heads and unordered rows in (next_attempt_at,
-- id) order. Leased, behind and paused rows are not in it, so a claim never
-- reads work it may not take. The predicate is static (never now()); the
-- claim's statements repeat it so that the planner may use the index.
CREATE INDEX pending_claimable ON outbox.pending (next_attempt_at, id) WHERE lease_token IS NULL AND NOT behind AND NOT paused;
-- A key's messages in sequence order: runs, and the next head.
CREATE UNIQUE INDEX pending_key_sequence ON outbox.pending (namespace, ordering_key, sequence_id) WHERE ordering_key IS NOT NULL;
-- At most one head per key: with claims starting only from heads, at most one
-- claim in flight per key.
CREATE UNIQUE INDEX pending_key_head ON outbox.pending (namespace, ordering_key) WHERE ordering_key IS NOT NULL AND NOT behind;
COMMENT ON INDEX outbox.pending_key_head IS 'At most one head per ordering key, so at most one claim in flight per key; a violation is a bug.';
-- Leases by expiry, for takeovers (every claim probes it once) and the
-- reaper. A claim's rows share one expiry, so its entries are adjacent.
-- attempt_count >= 0 is always true (a CHECK says so): it is in the
-- predicate so that only a statement that says it too can use the index,
-- and the completions, which find their rows by id, never walk it.
CREATE INDEX pending_lease_expiry ON outbox.pending (lease_expires_at) WHERE lease_token IS NOT NULL AND attempt_count >= 0;
-- Heads that keep failing, for blocked_keys() and stats().
CREATE INDEX pending_failing_heads ON outbox.pending (failing_since)
    WHERE ordering_key IS NOT NULL AND NOT behind AND failing_since IS NOT NULL;
-- The paused messages, for resume.
CREATE INDEX pending_paused ON outbox.pending (namespace, topic) WHERE paused;

CREATE TABLE outbox.attempts (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    uuid        NOT NULL,
    attempt_no    integer     NOT NULL,
    state         text        NOT NULL,
    worker_id     text,
    namespace     text        NOT NULL,
    topic         text        NOT NULL,
    tenant_id     text,
    dedupe_key    text,
    ordering_key  text,
    sequence_id   bigint,
    target        text,
    target_ref    text,
    error_code    text,
    error_message text,
    latency_ms    integer,
    operator      text,
    reason        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    db_user       text,
    note          text,
    CONSTRAINT attempts_state_valid CHECK (state IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'ZOMBIE_REQUEUE',
                                                     'REPLAYED', 'DISCARDED', 'RESCHEDULED')),
    CONSTRAINT attempts_attempt_no_nonnegative CHECK (attempt_no >= 0)
);
COMMENT ON TABLE outbox.attempts IS 'Append-only archive: one row per outcome. Only outbox.purge() deletes, for retention.';
COMMENT ON COLUMN outbox.attempts.db_user IS 'The database login (session_user) that made an operator action, beside the operator name it gave.';
-- The double-delivery backstop: a message is recorded as dispatched at most once.
CREATE UNIQUE INDEX attempts_one_dispatched_per_message ON outbox.attempts (message_id) WHERE state = 'DISPATCHED';
COMMENT ON INDEX outbox.attempts_one_dispatched_per_message IS 'At most one DISPATCHED outcome per message; a violation is a double-delivery bug.';
CREATE INDEX attempts_by_message ON outbox.attempts (message_id);
-- Retention purges by age; BRIN is tiny and cheap to maintain on an
-- insert-ordered timestamp.
CREATE INDEX attempts_created_at ON outbox.attempts USING brin (created_at);

CREATE TABLE outbox.dead (
    id              uuid        PRIMARY KEY,
    namespace       text        NOT NULL,
    topic           text        NOT NULL,
    tenant_id       text,
    dedupe_key      text,
    ordering_key    text,
    sequence_id     bigint,
    payload         jsonb       NOT NULL,
    payload_bytes   integer     NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    trace_header    text,
    attempt_count   integer     NOT NULL,
    available_at    timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    last_error_code text,
    last_error      text,
    failed_by       text,
    failed_at       timestamptz NOT NULL DEFAULT now(),
    holds_key       boolean     NOT NULL DEFAULT false,
    CONSTRAINT dead_holds_key_is_ordered CHECK (NOT holds_key OR ordering_key IS NOT NULL)
);
COMMENT ON TABLE outbox.dead IS 'Dead letters: terminal failures and exhausted retries; outbox.replay_dead() moves them back.';
COMMENT ON COLUMN outbox.dead.holds_key IS 'true: the message died as its key''s head under on_dead = park; the key waits until it is replayed or discarded.';
CREATE INDEX dead_failed_at ON outbox.dead (failed_at, id);
CREATE INDEX dead_namespace_topic ON outbox.dead (namespace, topic, failed_at);
-- A key's dead letters, for replay's notes and the key retention purge.
CREATE INDEX dead_key ON outbox.dead (namespace, ordering_key, sequence_id) WHERE ordering_key IS NOT NULL;
CREATE UNIQUE INDEX dead_key_holder ON outbox.dead (namespace, ordering_key) WHERE holds_key;

-- A dedupe key's window counts from its message's outcome (delivered or
-- discarded), which the archive records; when retention purges that archived
-- row while the key is kept, the outcome's time moves into settled_at.
CREATE TABLE outbox.dedupe (
    namespace   text        NOT NULL,
    topic       text        NOT NULL,
    dedupe_key  text        NOT NULL,
    message_id  uuid        NOT NULL,
    sequence_id bigint,
    created_at  timestamptz NOT NULL DEFAULT now(),
    settled_at  timestamptz,
    CONSTRAINT dedupe_pkey PRIMARY KEY (namespace, topic, dedupe_key)
);
COMMENT ON TABLE outbox.dedupe IS 'Enqueue idempotency: (namespace, topic, dedupe_key) -> message, kept for the retention window after delivery.';
COMMENT ON COLUMN outbox.dedupe.settled_at IS 'When the message was delivered or discarded, kept here once its archived outcome is purged; NULL while the archive has it.';
CREATE INDEX dedupe_created_at ON outbox.dedupe USING brin (created_at);

CREATE TABLE outbox.sequences (
    namespace        text        NOT NULL,
    ordering_key     text        NOT NULL,
    last_sequence_id bigint      NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sequences_pkey PRIMARY KEY (namespace, ordering_key)
);
COMMENT ON TABLE outbox.sequences IS 'Per (namespace, ordering key) sequence allocator; the row lock serialises producers of one key.';
-- Idle keys, oldest first, for the key retention purge.
CREATE INDEX sequences_updated_at ON outbox.sequences (updated_at);

CREATE TABLE outbox.sequence_floor (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_sequence_id bigint  NOT NULL DEFAULT 0
);
COMMENT ON TABLE outbox.sequence_floor IS 'A key new to outbox.sequences starts above this: no key''s sequence ids ever go back, even after its bookkeeping was purged.';
INSERT INTO outbox.sequence_floor DEFAULT VALUES;

-- One row per key with messages: the lock that serialises everyone who
-- changes the key's head. settled_at moves whenever a settle leaves the key
-- without a head, so that a producer at REPEATABLE READ whose snapshot missed
-- that change gets a serialisation failure at commit instead of queueing its
-- message behind a head that is gone.
CREATE TABLE outbox.keys (
    namespace       text        NOT NULL,
    ordering_key    text        NOT NULL,
    settled_at      timestamptz NOT NULL DEFAULT now(),
    -- No message of the key below this sequence id is pending: where a
    -- settle starts looking for the key's next head, so that it never
    -- steps over the index entries of what the key has delivered.
    low_sequence_id bigint      NOT NULL DEFAULT 0,
    CONSTRAINT keys_pkey PRIMARY KEY (namespace, ordering_key)
);
COMMENT ON TABLE outbox.keys IS 'One row per ordering key with messages: locked by whoever changes the key''s head.';
COMMENT ON COLUMN outbox.keys.low_sequence_id IS 'No pending message of the key has a lower sequence id: raised by settles, lowered by a replay.';

-- A row is a debt; a key may owe several. Rows are never updated, so
-- recording a debt never waits for anyone.
CREATE TABLE outbox.unsettled_keys (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace    text        NOT NULL,
    ordering_key text        NOT NULL,
    since        timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 1000);
COMMENT ON TABLE outbox.unsettled_keys IS 'Keys whose head a dispatcher could not settle without waiting; settled by the next claim or reaper pass.';
CREATE INDEX unsettled_keys_key ON outbox.unsettled_keys (namespace, ordering_key);

CREATE TABLE outbox.paused (
    namespace text        NOT NULL,
    -- '*': the whole namespace (no topic can be called '*').
    topic     text        NOT NULL DEFAULT '*',
    paused_by text,
    db_user   text        NOT NULL DEFAULT session_user,
    reason    text        NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT paused_pkey PRIMARY KEY (namespace, topic)
);
COMMENT ON TABLE outbox.paused IS 'Namespaces (topic *) and topics whose messages claims skip, with who paused them (paused_by as given, db_user the login), why and when.';

-- Limits every producer is held to, whatever its language. Change them as the
-- schema owner (UPDATE outbox.limits SET ...).
CREATE TABLE outbox.limits (
    singleton              boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    max_payload_bytes      integer  NOT NULL DEFAULT 262144 CHECK (max_payload_bytes BETWEEN 2 AND 10485760),
    max_key_bytes          integer  NOT NULL DEFAULT 512 CHECK (max_key_bytes BETWEEN 1 AND 4096),
    max_headers            integer  NOT NULL DEFAULT 16 CHECK (max_headers BETWEEN 0 AND 64),
    max_header_value_bytes integer  NOT NULL DEFAULT 1024 CHECK (max_header_value_bytes BETWEEN 1 AND 65536),
    max_delay              interval NOT NULL DEFAULT interval '365 days' CHECK (max_delay >= interval '0')
);
COMMENT ON TABLE outbox.limits IS 'Limits outbox.enqueue() holds every message to (one row); the Go producer''s Limits must not be looser.';
INSERT INTO outbox.limits DEFAULT VALUES;

-- Namespaces as a security boundary. A producer login that is a member of a
-- confined role (outbox.confined_producers) may enqueue only into those
-- roles' namespaces (so one team cannot enqueue into, squat the dedupe keys
-- of, or hold the ordering keys of another); a login in no confined role is
-- not confined.
CREATE TABLE outbox.producer_namespaces (
    role_name  name        NOT NULL,
    namespace  text        NOT NULL,
    granted_by text        NOT NULL DEFAULT session_user,
    granted_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT producer_namespaces_pkey PRIMARY KEY (role_name, namespace)
);
COMMENT ON TABLE outbox.producer_namespaces IS 'Namespaces a confined producer role may enqueue into (outbox.confined_producers).';

-- The producer roles that are confined: once granted a namespace, a role
-- stays confined when its namespaces are revoked (to none, then), until an
-- operator lifts the confinement; a role that is confined to nothing
-- enqueues nowhere rather than everywhere.
CREATE TABLE outbox.confined_producers (
    role_name   name        PRIMARY KEY,
    confined_by text        NOT NULL DEFAULT session_user,
    confined_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE outbox.confined_producers IS 'Producer roles confined to their namespaces (outbox.producer_namespaces), even when they have none left.';

-- Operators' actions that concern no single message (replays and discards
-- are in the archive, per message). Append-only, kept for good.
CREATE TABLE outbox.operator_log (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    action   text        NOT NULL,
    subject  text,
    operator text,
    db_user  text        NOT NULL DEFAULT session_user,
    reason   text,
    details  jsonb       NOT NULL DEFAULT '{}'::jsonb,
    CONSTRAINT operator_log_details_is_object CHECK (jsonb_typeof(details) = 'object')
);
COMMENT ON TABLE outbox.operator_log IS 'Append-only log of operator actions beyond single messages: action, subject, the operator name given, the login (db_user), reason, details.';
COMMENT ON COLUMN outbox.operator_log.operator IS 'The operator name the caller gave, if any; db_user is the login that made the action, whatever it said.';
CREATE INDEX operator_log_at ON outbox.operator_log USING brin (at);

-- What the migrator applied of migrations/functions: one row per file, so
-- that an unchanged function is not replaced.
CREATE TABLE outbox.function_sources (
    file       text        PRIMARY KEY,
    sha256     text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE outbox.function_sources IS 'The migrator''s record of the function files applied (migrations/functions), by checksum.';

-- No runtime role writes a table directly: every write goes through the
-- functions, which grant their own EXECUTE.
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA outbox FROM PUBLIC;
GRANT USAGE ON SCHEMA outbox TO outbox_producer, outbox_dispatcher, outbox_operator, outbox_reader;
GRANT SELECT ON outbox.pending, outbox.attempts, outbox.dead, outbox.limits, outbox.operator_log, outbox.paused,
                 outbox.producer_namespaces, outbox.confined_producers
    TO outbox_operator, outbox_reader;

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    v_role text;
BEGIN
    DROP SCHEMA IF EXISTS outbox CASCADE;
    IF to_regclass('public.outbox_schema_migrations') IS NOT NULL THEN
        REVOKE ALL ON public.outbox_schema_migrations FROM outbox_owner;
        IF pg_catalog.pg_get_serial_sequence('public.outbox_schema_migrations', 'id') IS NOT NULL THEN
            EXECUTE format('REVOKE ALL ON SEQUENCE %s FROM outbox_owner',
                           pg_catalog.pg_get_serial_sequence('public.outbox_schema_migrations', 'id'));
        END IF;
    END IF;
    FOREACH v_role IN ARRAY ARRAY['outbox_producer', 'outbox_dispatcher', 'outbox_operator', 'outbox_reader', 'outbox_owner'] LOOP
        BEGIN
            IF v_role = 'outbox_owner' THEN
                EXECUTE 'ALTER DEFAULT PRIVILEGES FOR ROLE outbox_owner GRANT EXECUTE ON FUNCTIONS TO PUBLIC';
            END IF;
            EXECUTE format('DROP ROLE IF EXISTS %I', v_role);
        EXCEPTION WHEN dependent_objects_still_exist THEN
            -- Still granted in another database of this cluster, or to a
            -- login user: leave the role for that database's own rollback
            -- or for the administrator.
            RAISE NOTICE 'role % is still in use elsewhere; not dropped', v_role;
        WHEN internal_error THEN
            -- DROP ROLE lists what depends on the role across the cluster; a
            -- database dropped at that moment makes the listing fail. The
            -- role may still be in use, as above: leave it.
            RAISE NOTICE 'role % not dropped: %', v_role, SQLERRM;
        END;
    END LOOP;
END;
$$;
-- +goose StatementEnd
