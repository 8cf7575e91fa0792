-- Ordered runs, explicit key heads, parked keys, and a database that refuses
-- what the producer API refuses.
--
-- Keys. An ordering key is now scoped by its namespace: (namespace,
-- ordering_key) names a key, so one team's keys never hold another's
-- messages. Each key's messages are in outbox.pending in sequence order; at
-- most one of them is the key's *head* (behind = false), every later one is
-- behind it (behind = true). Only heads and unordered rows are in the claim
-- index, so a key with a million messages queued behind a stuck head costs a
-- claim nothing. A claim takes a head and up to p_max_run - 1 of the messages
-- behind it (a *run*), all under one lease token; the head stays the key's
-- head until it is delivered or dead, so no two claims are ever in flight on
-- one key (pending_key_head is the database's guarantee of it).
--
-- Settling. Whoever changes which message should be a key's head — a
-- completion, the reaper, a replay, a discard, and a producer committing the
-- first message of an idle key — settles the key: it locks the key's row in
-- outbox.keys, then (with a fresh snapshot) makes the lowest pending message
-- the head, unless the key is parked or its head is in flight. Producers
-- settle at commit (a deferred trigger on outbox.sequences), so they hold the
-- key's lock only for the instant of their commit; dispatchers never wait for
-- a producer: they lock with SKIP LOCKED and leave a key they could not lock
-- in outbox.unsettled_keys, which the next claim (or the reaper) settles.
--
-- Parking. A head that dies under a route's on_dead = 'park' stays in
-- outbox.dead holding its key (holds_key): the key's later messages wait until
-- it is replayed (it goes first) or discarded by an operator with a reason.
--
-- SQLSTATEs added: P7004 invalid message (enqueue refused it; the error's
-- COLUMN field names the parameter at fault).

-- +goose Up

-- Limits every producer is held to, whatever its language. Change them as the
-- schema owner (UPDATE outbox.limits SET ...); the Go producer's Limits must
-- not be looser, or its messages would be refused here instead of in Go.
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
-- role with rows here may enqueue only into those roles' namespaces (so one
-- team cannot enqueue into, squat the dedupe keys of, or hold the ordering
-- keys of another); a login with none is not confined, which keeps the four
-- roles the simple default. Operators manage it with outbox.grant_namespace
-- and outbox.revoke_namespace.
CREATE TABLE outbox.producer_namespaces (
    role_name  name        NOT NULL,
    namespace  text        NOT NULL,
    granted_by text        NOT NULL DEFAULT session_user,
    granted_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT producer_namespaces_pkey PRIMARY KEY (role_name, namespace)
);
COMMENT ON TABLE outbox.producer_namespaces IS 'Namespaces a producer role is confined to; a login in none of these roles is not confined.';

-- The size of each payload's JSON text as the producer sent it, kept so that
-- a claim can bound its memory without reading (and decompressing) payloads.
ALTER TABLE outbox.pending
    ADD COLUMN behind        boolean NOT NULL DEFAULT false,
    ADD COLUMN payload_bytes integer,
    ADD COLUMN failing_since timestamptz,
    ADD COLUMN park_on_dead  boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT pending_behind_is_ordered CHECK (NOT behind OR ordering_key IS NOT NULL);
UPDATE outbox.pending SET payload_bytes = octet_length(payload::text);
ALTER TABLE outbox.pending ALTER COLUMN payload_bytes SET NOT NULL;
COMMENT ON COLUMN outbox.pending.behind IS 'true: an earlier message of the same (namespace, ordering_key) is still to go first; not claimable.';
COMMENT ON COLUMN outbox.pending.failing_since IS 'When the message first failed retryably; a head failing since then blocks its key.';
COMMENT ON COLUMN outbox.pending.park_on_dead IS 'The route''s on_dead policy as the dispatcher last reported it: true parks the key if the message dies.';

ALTER TABLE outbox.dead
    ADD COLUMN holds_key     boolean NOT NULL DEFAULT false,
    ADD COLUMN payload_bytes integer,
    ADD CONSTRAINT dead_holds_key_is_ordered CHECK (NOT holds_key OR ordering_key IS NOT NULL);
UPDATE outbox.dead SET payload_bytes = octet_length(payload::text);
ALTER TABLE outbox.dead ALTER COLUMN payload_bytes SET NOT NULL;
COMMENT ON COLUMN outbox.dead.holds_key IS 'true: the message died as its key''s head under on_dead = park; the key waits until it is replayed or discarded.';

ALTER TABLE outbox.attempts
    ADD COLUMN db_user text,
    ADD COLUMN note    text,
    DROP CONSTRAINT attempts_state_valid,
    ADD CONSTRAINT attempts_state_valid CHECK (state IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'ZOMBIE_REQUEUE', 'REPLAYED', 'DISCARDED'));
COMMENT ON COLUMN outbox.attempts.db_user IS 'The database login (session_user) that made an operator action, beside the operator name it gave.';

-- A dedupe key's window counts from its message's outcome (delivered or
-- discarded), which the archive records. When retention deletes that
-- archived row while the key is still kept, the outcome's time moves into
-- the key (settled_at), so that no order of purges can make a key forget
-- when its message went. A key whose message left no trace at all (its
-- archive purged before this migration) has its enqueue time, the only time
-- known and the one keys were counted from until now.
ALTER TABLE outbox.dedupe ADD COLUMN settled_at timestamptz;
COMMENT ON COLUMN outbox.dedupe.settled_at IS 'When the message was delivered or discarded, kept here once its archived outcome is purged; NULL while the archive has it.';
UPDATE outbox.dedupe k SET settled_at = k.created_at
WHERE NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = k.message_id)
  AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = k.message_id)
  AND NOT EXISTS (SELECT 1 FROM outbox.attempts a WHERE a.message_id = k.message_id AND a.state IN ('DISPATCHED', 'DISCARDED'));

-- Operators' actions that concern no single message (replays and discards
-- are in the archive, per message): who granted or revoked a namespace, who
-- shortened the audit trail. Append-only, kept for good, written only by the
-- outbox functions.
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

-- +goose StatementBegin
CREATE FUNCTION outbox.operator_log_append_only() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'outbox.operator_log is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'P0001',
              HINT = 'Operator actions are recorded by the outbox functions, and kept.';
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER operator_log_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON outbox.operator_log
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.operator_log_append_only();

-- +goose StatementBegin
-- record_operator_action appends to outbox.operator_log; the operator
-- functions call it as the owner, and no runtime role may.
CREATE FUNCTION outbox.record_operator_action(
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
-- +goose StatementEnd

-- Sequences, re-keyed by (namespace, ordering_key). A key that is new to a
-- namespace starts above outbox.sequence_floor, which is at least every
-- sequence id a key ever had before its bookkeeping was purged, so that a
-- key's sequence ids only ever grow. Existing keys keep their counters in
-- every namespace that has messages of them; the floor covers the rest.
ALTER TABLE outbox.sequences RENAME TO sequences_global;
ALTER TABLE outbox.sequences_global RENAME CONSTRAINT sequences_pkey TO sequences_global_pkey;
CREATE TABLE outbox.sequences (
    namespace        text        NOT NULL,
    ordering_key     text        NOT NULL,
    last_sequence_id bigint      NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sequences_pkey PRIMARY KEY (namespace, ordering_key)
);
COMMENT ON TABLE outbox.sequences IS 'Per (namespace, ordering key) sequence allocator; the row lock serialises producers of one key.';
CREATE TABLE outbox.sequence_floor (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_sequence_id bigint  NOT NULL DEFAULT 0
);
COMMENT ON TABLE outbox.sequence_floor IS 'A key new to outbox.sequences starts above this: no key''s sequence ids ever go back, even after its bookkeeping was purged.';
INSERT INTO outbox.sequence_floor (last_sequence_id) SELECT coalesce(max(last_sequence_id), 0) FROM outbox.sequences_global;
INSERT INTO outbox.sequences (namespace, ordering_key, last_sequence_id, updated_at)
SELECT k.namespace, k.ordering_key, g.last_sequence_id, g.updated_at
FROM (SELECT DISTINCT namespace, ordering_key FROM outbox.pending WHERE ordering_key IS NOT NULL
      UNION
      SELECT DISTINCT namespace, ordering_key FROM outbox.dead WHERE ordering_key IS NOT NULL) k
JOIN outbox.sequences_global g ON g.ordering_key = k.ordering_key;
DROP TABLE outbox.sequences_global;

-- One row per key with messages: the lock that serialises everyone who
-- changes the key's head (see "Settling" above). settled_at moves whenever a
-- settle leaves the key without a head, so that a producer at REPEATABLE READ
-- whose snapshot missed that change gets a serialisation failure at commit
-- instead of queueing its message behind a head that is gone.
CREATE TABLE outbox.keys (
    namespace    text        NOT NULL,
    ordering_key text        NOT NULL,
    settled_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT keys_pkey PRIMARY KEY (namespace, ordering_key)
);
COMMENT ON TABLE outbox.keys IS 'One row per ordering key with messages: locked by whoever changes the key''s head.';
INSERT INTO outbox.keys (namespace, ordering_key)
SELECT namespace, ordering_key FROM outbox.sequences;

-- Keys a dispatcher could not settle without waiting (a producer was
-- committing to them): the next claim or reaper pass settles them. A row is
-- a debt; a key may owe several. Rows have their own ids and are never
-- updated, so recording a debt never waits for anyone; only the sweep that
-- pays a debt deletes its row.
CREATE TABLE outbox.unsettled_keys (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace    text        NOT NULL,
    ordering_key text        NOT NULL,
    since        timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 1000);
CREATE INDEX unsettled_keys_key ON outbox.unsettled_keys (namespace, ordering_key);
COMMENT ON TABLE outbox.unsettled_keys IS 'Keys whose head a dispatcher could not settle without waiting; settled by the next claim or reaper pass.';

-- The indexes of keys and heads. The claim index holds only what can be
-- claimed: unleased heads and unordered rows.
DROP INDEX outbox.pending_claimable;
DROP INDEX outbox.pending_ordering_key_sequence;
CREATE UNIQUE INDEX pending_key_sequence ON outbox.pending (namespace, ordering_key, sequence_id) WHERE ordering_key IS NOT NULL;
UPDATE outbox.pending p SET behind = true
WHERE p.ordering_key IS NOT NULL
  AND EXISTS (SELECT 1 FROM outbox.pending q
              WHERE q.namespace = p.namespace AND q.ordering_key = p.ordering_key AND q.sequence_id < p.sequence_id);
CREATE INDEX pending_claimable ON outbox.pending (next_attempt_at, id) WHERE lease_token IS NULL AND NOT behind;
-- At most one head per key: with claims starting only from heads, at most one
-- claim in flight per key. A violation is a bug in the settling above.
CREATE UNIQUE INDEX pending_key_head ON outbox.pending (namespace, ordering_key) WHERE ordering_key IS NOT NULL AND NOT behind;
COMMENT ON INDEX outbox.pending_key_head IS 'At most one head per ordering key, so at most one claim in flight per key; a violation is a bug.';
CREATE UNIQUE INDEX dead_key_holder ON outbox.dead (namespace, ordering_key) WHERE holds_key;
-- Leases by expiry. Every claim looks here for expired leases to take over
-- (with none, one descent that finds nothing), and so does the reaper.
-- Migration 1 left this index out while only the reaper, once a minute,
-- looked for them; a claim cannot afford a scan of the queue. It costs a
-- claim one index entry per row leased; a claim's rows share one expiry, so
-- its entries are adjacent (deduplicated) and a lease is found by its
-- expiry.
--
-- attempt_count >= 0 is always true (a CHECK says so): it is in the
-- predicate so that only a statement that says it too can use the index.
-- The completions' statements find their rows by id, on plans made once per
-- session; any lease they check implies lease_token IS NOT NULL, and with
-- statistics taken while nothing was leased this index looks empty, so
-- they walked every live lease for each batch through it instead.
CREATE INDEX pending_lease_expiry ON outbox.pending (lease_expires_at) WHERE lease_token IS NOT NULL AND attempt_count >= 0;

-- +goose StatementBegin
-- lock_keys creates the keys' rows if they are missing and locks them, in
-- key order, waiting for whoever holds them. Everyone who waits for a key's
-- lock takes it before touching the key's messages, so that no one holding
-- a key's lock ever waits for them.
CREATE FUNCTION outbox.lock_keys(p_namespaces text[], p_keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- The keys given, by primary key: see outbox.claim_batch.
SET jit = off
AS $$
BEGIN
    IF coalesce(cardinality(p_keys), 0) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO outbox.keys (namespace, ordering_key)
    SELECT DISTINCT k.ns, k.ok FROM unnest(p_namespaces, p_keys) AS k(ns, ok) ORDER BY 1, 2
    ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING;
    PERFORM 1 FROM (SELECT k.namespace, k.ordering_key FROM outbox.keys k
                    WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(p_namespaces, p_keys))
                    ORDER BY 1, 2
                    FOR UPDATE) x;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- settle_keys makes each key's lowest pending message its head, unless the
-- key is parked or its head is in flight (leased), and returns how many keys
-- it could not settle. p_wait decides what happens when another transaction
-- holds a key's lock: wait for it (producers at commit, operators, who took
-- the lock first anyway), or record the debt in outbox.unsettled_keys
-- (dispatchers, which must never wait for a producer's transaction). Not
-- executable by any runtime role; the outbox functions call it as its owner.
-- A producer's commit runs it for its key: it costs only the statements a
-- key's state calls for.
CREATE FUNCTION outbox.settle_keys(p_namespaces text[], p_keys text[], p_wait boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Restores the caller's setting on return: see the set_config below.
SET plan_cache_mode = auto
-- Every statement here finds rows by key. A plan cached while a table was
-- nearly empty would scan it in full until the next ANALYZE (20,000 rows
-- later, for outbox.pending): never scan a table where an index will do.
-- That makes a plan's cost look huge, which must not buy it a JIT
-- compilation (100 ms and more for a statement of microseconds).
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_ns      text[];
    v_ok      text[];
    v_missed  integer := 0;
    v_head    uuid[];
    v_want    uuid[];
    v_change  boolean;
    v_headless boolean;
    v_demoted uuid[];
BEGIN
    IF coalesce(cardinality(p_keys), 0) = 0 THEN
        RETURN 0;
    END IF;
    -- Many keys (a completion's) are joined with the tables: plan for the
    -- data at hand. One key (a producer's commit) is a few primary-key
    -- probes, whose generic plans are right and not worth planning anew.
    PERFORM set_config('plan_cache_mode', CASE WHEN cardinality(p_keys) > 1 THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);

    -- 1. Lock the keys' rows, in key order so that settlers never deadlock.
    IF p_wait THEN
        INSERT INTO outbox.keys (namespace, ordering_key)
        SELECT DISTINCT k.ns, k.ok FROM unnest(p_namespaces, p_keys) AS k(ns, ok) ORDER BY 1, 2
        ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING;
        SELECT array_agg(x.namespace ORDER BY x.namespace, x.ordering_key),
               array_agg(x.ordering_key ORDER BY x.namespace, x.ordering_key)
          INTO v_ns, v_ok
          FROM (SELECT k.namespace, k.ordering_key FROM outbox.keys k
                WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(p_namespaces, p_keys))
                ORDER BY 1, 2
                FOR UPDATE) x;
    ELSE
        SELECT array_agg(x.namespace ORDER BY x.namespace, x.ordering_key),
               array_agg(x.ordering_key ORDER BY x.namespace, x.ordering_key)
          INTO v_ns, v_ok
          FROM (SELECT k.namespace, k.ordering_key FROM outbox.keys k
                WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(p_namespaces, p_keys))
                ORDER BY 1, 2
                FOR UPDATE SKIP LOCKED) x;
        -- Keys not locked are someone else's right now: owe them a settle.
        IF coalesce(cardinality(v_ns), 0) < cardinality(p_keys) THEN
            INSERT INTO outbox.unsettled_keys (namespace, ordering_key)
            SELECT DISTINCT k.ns, k.ok FROM unnest(p_namespaces, p_keys) AS k(ns, ok)
            WHERE NOT EXISTS (SELECT 1 FROM unnest(v_ns, v_ok) AS l(ns, ok) WHERE l.ns = k.ns AND l.ok = k.ok);
            GET DIAGNOSTICS v_missed = ROW_COUNT;
        END IF;
    END IF;
    IF v_ns IS NULL THEN
        RETURN v_missed;
    END IF;

    -- 2. With the locks held, a new statement sees every committed change to
    --    these keys: find each key's head and the message that should be
    --    its head (none while the key is parked; the head itself while a
    --    claim holds it).
    SELECT array_agg(s.head ORDER BY s.i), array_agg(s.want ORDER BY s.i),
           bool_or(s.want IS DISTINCT FROM s.head), bool_or(s.want IS NULL)
      INTO v_head, v_want, v_change, v_headless
      FROM (SELECT k.i, h.id AS head,
                   CASE WHEN EXISTS (SELECT 1 FROM outbox.dead d
                                     WHERE d.namespace = k.ns AND d.ordering_key = k.ok AND d.holds_key) THEN NULL
                        WHEN h.lease_token IS NOT NULL THEN h.id
                        ELSE (SELECT p.id FROM outbox.pending p
                              WHERE p.namespace = k.ns AND p.ordering_key = k.ok
                              ORDER BY p.sequence_id LIMIT 1)
                   END AS want
            FROM unnest(v_ns, v_ok) WITH ORDINALITY AS k(ns, ok, i)
            LEFT JOIN outbox.pending h ON h.namespace = k.ns AND h.ordering_key = k.ok AND NOT h.behind) s;

    -- 3. Demote a head that should not be one (a replayed message with a
    --    lower sequence id goes first), unless a claim leased it meanwhile:
    --    then it is in flight and stays the head. Then promote the rightful
    --    head where the key has none now. Two statements, in this order, so
    --    that pending_key_head never sees two heads of one key.
    IF v_change THEN
        WITH demoted AS (
            UPDATE outbox.pending p SET behind = true
            FROM unnest(v_head, v_want) AS x(head, want)
            WHERE p.id = x.head AND x.want IS DISTINCT FROM x.head AND p.lease_token IS NULL
            RETURNING p.id
        )
        SELECT array_agg(d.id) INTO v_demoted FROM demoted d;
        UPDATE outbox.pending p SET behind = false
        FROM unnest(v_head, v_want) AS x(head, want)
        WHERE p.id = x.want AND x.want IS DISTINCT FROM x.head
          AND (x.head IS NULL OR x.head = ANY (v_demoted));
    END IF;

    -- 4. A key left without a head: mark the change for producers at
    --    REPEATABLE READ (see outbox.keys).
    IF v_headless THEN
        UPDATE outbox.keys k SET settled_at = clock_timestamp()
        FROM unnest(v_ns, v_ok, v_want) AS x(ns, ok, want)
        WHERE k.namespace = x.ns AND k.ordering_key = x.ok AND x.want IS NULL;
    END IF;
    RETURN v_missed;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- settle_unsettled pays up to p_limit debts dispatchers recorded in
-- outbox.unsettled_keys (claims and the reaper call it); a key still locked
-- by someone else gets a new debt. Returns the keys settled.
CREATE FUNCTION outbox.settle_unsettled(p_limit int)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- At most p_limit debts, by index: see outbox.claim_batch.
SET jit = off
AS $$
DECLARE
    v_ns text[];
    v_ok text[];
BEGIN
    WITH paid AS (
        DELETE FROM outbox.unsettled_keys u
        WHERE u.id IN (SELECT x.id FROM outbox.unsettled_keys x ORDER BY x.id LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING u.namespace, u.ordering_key
    )
    SELECT array_agg(d.namespace), array_agg(d.ordering_key) INTO v_ns, v_ok
    FROM (SELECT DISTINCT p.namespace, p.ordering_key FROM paid p) d;
    IF v_ns IS NULL THEN
        RETURN 0;
    END IF;
    RETURN cardinality(v_ns) - outbox.settle_keys(v_ns, v_ok, false);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A producer settles the keys it enqueued to when it commits: a key that had
-- nothing pending gets its first message as its head. The trigger is on the
-- sequence allocator, so it fires once per key and statement, not once per
-- message. Deferred to commit, it holds the key's lock for that instant only;
-- under SET CONSTRAINTS ALL IMMEDIATE it holds it until commit, and
-- dispatchers, which never wait for it, leave the key to the next claim.
CREATE FUNCTION outbox.sequences_settle_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM outbox.settle_keys(ARRAY[NEW.namespace], ARRAY[NEW.ordering_key], true);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE CONSTRAINT TRIGGER sequences_settle_at_commit
    AFTER INSERT OR UPDATE ON outbox.sequences
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION outbox.sequences_settle_at_commit();

-- +goose StatementBegin
-- enqueue_batch writes many messages in one statement, and is enqueue()
-- too: enqueue() is a batch of one, so that the two can never disagree on
-- validation, dedupe or sequencing. Element i of every array describes
-- message i; optional arrays may be NULL. Results come back in input order;
-- within one batch the first message with a dedupe key wins it and later
-- ones are dedupe hits, exactly as with enqueue() called in order. Every
-- message is checked against outbox.limits and the rules the Go producer
-- applies, and the whole call is refused at the first bad message with
-- SQLSTATE P7004, the field in the error's COLUMN, the message's index in
-- its DETAIL, and nothing written.
CREATE OR REPLACE FUNCTION outbox.enqueue_batch(
    p_namespaces    text[],
    p_topics        text[],
    p_payloads      text[],
    p_tenant_ids    text[] DEFAULT NULL,
    p_dedupe_keys   text[] DEFAULT NULL,
    p_ordering_keys text[] DEFAULT NULL,
    p_headers       text[] DEFAULT NULL,
    p_trace_headers text[] DEFAULT NULL,
    p_available_at  timestamptz[] DEFAULT NULL)
RETURNS TABLE(message_id uuid, sequence_id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Restores the caller's setting on return: see the set_config below.
SET plan_cache_mode = auto
-- Every statement here finds rows by key. A plan cached while a table was
-- nearly empty would scan it in full until the next ANALYZE (20,000 rows
-- later, for outbox.pending): never scan a table where an index will do.
-- That makes a plan's cost look huge, which must not buy it a JIT
-- compilation (100 ms and more for a statement of microseconds).
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_n        int := coalesce(cardinality(p_namespaces), 0);
    v_now      timestamptz := now();
    v_max_payload       int;
    v_max_key           int;
    v_max_headers       int;
    v_max_header_value  int;
    v_max_delay         interval;
    v_floor    bigint;
    v_payloads jsonb[];
    v_headers  jsonb[];
    v_ids      uuid[];
    v_inserted boolean[];
    v_seqs     bigint[];
    v_problem  text[];
    v_allowed  text[];
    -- Errors name the function the producer called (see enqueue()).
    v_caller   text := CASE WHEN v_n = 1 AND current_setting('outbox.enqueue_single', true) = 'on'
                            THEN 'outbox.enqueue' ELSE 'outbox.enqueue_batch' END;
    -- C0 and C1 control characters, as Go's unicode.IsControl (no NUL in text).
    c_control  constant text := '[\u0001-\u001f\u007f-\u009f]';
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_topics), 0) <> v_n OR coalesce(cardinality(p_payloads), 0) <> v_n
       OR coalesce(cardinality(p_tenant_ids), v_n) <> v_n OR coalesce(cardinality(p_dedupe_keys), v_n) <> v_n
       OR coalesce(cardinality(p_ordering_keys), v_n) <> v_n OR coalesce(cardinality(p_headers), v_n) <> v_n
       OR coalesce(cardinality(p_trace_headers), v_n) <> v_n OR coalesce(cardinality(p_available_at), v_n) <> v_n THEN
        RAISE EXCEPTION '%: every array must have one element per message (% messages)', v_caller, v_n
            USING ERRCODE = '22023';
    END IF;
    -- A batch's statements join arrays with the tables, and a generic plan
    -- made while the tables were small would keep scanning dedupe in full
    -- as it grows: plan them for the data at hand. A single message's
    -- statements are primary-key probes whose generic plans are right
    -- whatever the sizes, and planning them on every call (as auto would,
    -- generic plans of array expressions being costed high) triples the
    -- cost of an enqueue.
    PERFORM set_config('plan_cache_mode', CASE WHEN v_n > 1 THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true);

    -- The limits, the message ids, and the keys as they are stored: an
    -- empty key is no key, as for the Go producer, and an array with no
    -- key at all is NULL, so that the steps for dedupe and ordering are
    -- skipped. One statement: every statement of an enqueue costs.
    SELECT (SELECT l.max_payload_bytes FROM outbox.limits l), (SELECT l.max_key_bytes FROM outbox.limits l),
           (SELECT l.max_headers FROM outbox.limits l), (SELECT l.max_header_value_bytes FROM outbox.limits l),
           (SELECT l.max_delay FROM outbox.limits l),
           -- The namespaces this login is confined to (NULL: none).
           (SELECT array_agg(g.namespace) FROM outbox.producer_namespaces g
            JOIN pg_catalog.pg_roles r ON r.rolname = g.role_name
            WHERE pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')
              AND NOT (SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname = session_user)),
           array_agg(outbox.uuid_v7() ORDER BY e.i),
           CASE WHEN bool_or(nullif(e.tenant, '') IS NOT NULL) THEN array_agg(nullif(e.tenant, '') ORDER BY e.i) END,
           CASE WHEN bool_or(nullif(e.dk, '') IS NOT NULL) THEN array_agg(nullif(e.dk, '') ORDER BY e.i) END,
           CASE WHEN bool_or(nullif(e.ok, '') IS NOT NULL) THEN array_agg(nullif(e.ok, '') ORDER BY e.i) END,
           CASE WHEN bool_or(nullif(e.trace, '') IS NOT NULL) THEN array_agg(nullif(e.trace, '') ORDER BY e.i) END
      INTO v_max_payload, v_max_key, v_max_headers, v_max_header_value, v_max_delay, v_allowed, v_ids, p_tenant_ids, p_dedupe_keys, p_ordering_keys, p_trace_headers
      FROM unnest(p_namespaces, p_tenant_ids, p_dedupe_keys, p_ordering_keys, p_trace_headers) WITH ORDINALITY
           AS e(ns, tenant, dk, ok, trace, i);

    IF v_allowed IS NOT NULL THEN
        SELECT ARRAY[x.i::text, x.ns] INTO v_problem
        FROM unnest(p_namespaces) WITH ORDINALITY AS x(ns, i)
        WHERE NOT (x.ns = ANY (v_allowed))
        ORDER BY x.i LIMIT 1;
        IF v_problem IS NOT NULL THEN
            RAISE EXCEPTION '%: login % may not enqueue into namespace %', v_caller, session_user, quote_literal(v_problem[2])
                USING ERRCODE = '42501', COLUMN = 'namespace',
                      DETAIL = format('message index: %s', CASE WHEN v_caller = 'outbox.enqueue' THEN -1 ELSE v_problem[1]::int - 1 END),
                      HINT = format('Its roles may enqueue into: %s. An operator grants more with outbox.grant_namespace(role, namespace).',
                                    array_to_string(v_allowed, ', '));
        END IF;
        v_problem := NULL;
    END IF;

    -- Every check, and the parse of payloads and headers for the insert, in
    -- one pass; the first message at fault is named. A payload is parsed
    -- only once it is known not to be over the limit. The name patterns are
    -- unbounded with a separate length check: PostgreSQL's regular
    -- expressions are ten times slower with {0,127}. A document PostgreSQL
    -- cannot store (bad syntax, \u0000, a lone surrogate, a number beyond
    -- numeric) fails the parse; the handler finds which. The block only
    -- reads, so its subtransaction takes no transaction id.
    BEGIN
        SELECT ARRAY[(array_agg(x.i::text ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1],
                     (array_agg(x.problem[1] ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1],
                     (array_agg(x.problem[2] ORDER BY x.i) FILTER (WHERE x.problem IS NOT NULL))[1]],
               array_agg(x.pj ORDER BY x.i), array_agg(x.hj ORDER BY x.i)
          INTO v_problem, v_payloads, v_headers
          FROM (
            SELECT e.i, c.pj, c.hj, CASE
                WHEN e.ns IS NULL OR e.ns = '' THEN ARRAY['namespace', 'must not be empty']
                WHEN octet_length(e.ns) > 128 OR e.ns !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' THEN
                    ARRAY['namespace', format('%s must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit', quote_literal(left(e.ns, 140)))]
                WHEN e.tp IS NULL OR e.tp = '' THEN ARRAY['topic', 'must not be empty']
                WHEN octet_length(e.tp) > 128 OR e.tp !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' THEN
                    ARRAY['topic', format('%s must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit', quote_literal(left(e.tp, 140)))]
                WHEN e.payload IS NULL OR e.payload = '' THEN ARRAY['payload', 'must not be empty']
                WHEN octet_length(e.payload) > v_max_payload THEN
                    ARRAY['payload', format('is %s bytes, over the limit of %s', octet_length(e.payload), v_max_payload)]
                WHEN jsonb_typeof(c.pj) NOT IN ('object', 'array') THEN
                    ARRAY['payload', 'must be a JSON object or array, not a ' || jsonb_typeof(c.pj)]
                WHEN octet_length(e.tenant) > v_max_key THEN
                    ARRAY['tenant_id', format('is %s bytes, over the limit of %s', octet_length(e.tenant), v_max_key)]
                WHEN e.tenant ~ c_control THEN ARRAY['tenant_id', 'contains a control character']
                WHEN octet_length(e.dk) > v_max_key THEN
                    ARRAY['dedupe_key', format('is %s bytes, over the limit of %s', octet_length(e.dk), v_max_key)]
                WHEN e.dk ~ c_control THEN ARRAY['dedupe_key', 'contains a control character']
                WHEN octet_length(e.ok) > v_max_key THEN
                    ARRAY['ordering_key', format('is %s bytes, over the limit of %s', octet_length(e.ok), v_max_key)]
                WHEN e.ok ~ c_control THEN ARRAY['ordering_key', 'contains a control character']
                WHEN octet_length(e.trace) > 256 THEN ARRAY['trace_header', format('is %s bytes, over the limit of 256', octet_length(e.trace))]
                WHEN e.trace !~ '^[!-~]*$' THEN ARRAY['trace_header', 'must be printable ASCII without spaces']
                WHEN NOT isfinite(e.at) THEN ARRAY['available_at', format('must be a finite time, got %s', e.at)]
                -- The clock now, not the transaction's start: a producer's
                -- own check of the same bound, made just before, must not be
                -- looser.
                WHEN e.at > clock_timestamp() + v_max_delay THEN
                    ARRAY['available_at', format('is more than %s ahead (%s); the limit is outbox.limits.max_delay', v_max_delay, e.at)]
                WHEN octet_length(e.headers) > 1048576 THEN ARRAY['headers', 'are over 1 MiB of JSON']
                WHEN c.hj IS NULL OR c.hj = '{}'::jsonb THEN NULL
                WHEN jsonb_typeof(c.hj) <> 'object' THEN ARRAY['headers', 'must be a JSON object of strings']
                WHEN (SELECT count(*) FROM jsonb_object_keys(c.hj)) > v_max_headers THEN
                    ARRAY['headers', format('has %s entries, more than the limit of %s',
                                            (SELECT count(*) FROM jsonb_object_keys(c.hj)), v_max_headers)]
                ELSE (SELECT ARRAY['headers', h.problem]
                      FROM (SELECT kv.key, CASE
                                WHEN octet_length(kv.key) > 64 OR kv.key !~ '^[A-Za-z0-9][A-Za-z0-9_.-]*$' THEN
                                    format('name %s must be 1-64 characters of letters, digits and _ . -, starting with a letter or digit', quote_ident(left(kv.key, 80)))
                                WHEN lower(kv.key) LIKE ANY (ARRAY['outbox%', 'webhook-%', 'aws.%', 'amazon.%', 'x-amz%'])
                                     OR lower(kv.key) IN ('content-type', 'content-length', 'host', 'idempotency-key',
                                                          'user-agent', 'connection', 'transfer-encoding') THEN
                                    format('name %s is reserved for the dispatcher', quote_ident(kv.key))
                                WHEN jsonb_typeof(kv.value) <> 'string' THEN
                                    format('value of %s must be a string, got %s', quote_ident(kv.key), jsonb_typeof(kv.value))
                                WHEN octet_length(kv.value #>> '{}') > v_max_header_value THEN
                                    format('value of %s is %s bytes, over the limit of %s', quote_ident(kv.key),
                                           octet_length(kv.value #>> '{}'), v_max_header_value)
                                WHEN (kv.value #>> '{}') ~ c_control THEN
                                    format('value of %s contains a control character', quote_ident(kv.key))
                            END AS problem
                            FROM jsonb_each(c.hj) kv) h
                      WHERE h.problem IS NOT NULL
                      ORDER BY h.key
                      LIMIT 1)
            END AS problem
            FROM unnest(p_namespaces, p_topics, p_payloads, p_tenant_ids, p_dedupe_keys, p_ordering_keys,
                        p_trace_headers, p_available_at, p_headers) WITH ORDINALITY
                 AS e(ns, tp, payload, tenant, dk, ok, trace, at, headers, i)
            CROSS JOIN LATERAL (
                SELECT CASE WHEN octet_length(e.payload) BETWEEN 1 AND v_max_payload THEN e.payload::jsonb END AS pj,
                       CASE WHEN octet_length(e.headers) <= 1048576 THEN e.headers::jsonb END AS hj) c
          ) x;
    EXCEPTION WHEN data_exception THEN
        FOR i IN 1 .. v_n LOOP
            BEGIN
                PERFORM CASE WHEN octet_length(p_payloads[i]) <= v_max_payload THEN p_payloads[i]::jsonb END;
            EXCEPTION WHEN data_exception THEN
                v_problem := ARRAY[i::text, 'payload', 'is not valid JSON: ' || SQLERRM];
                EXIT;
            END;
            BEGIN
                PERFORM CASE WHEN octet_length(p_headers[i]) <= 1048576 THEN p_headers[i]::jsonb END;
            EXCEPTION WHEN data_exception THEN
                v_problem := ARRAY[i::text, 'headers', 'are not valid JSON: ' || SQLERRM];
                EXIT;
            END;
        END LOOP;
        IF v_problem[1] IS NULL THEN
            RAISE;
        END IF;
    END;

    IF v_problem[1] IS NOT NULL THEN
        -- DETAIL carries the message's index in the batch, for callers.
        IF v_caller = 'outbox.enqueue' THEN
            RAISE EXCEPTION '%: invalid message: % %', v_caller, v_problem[2], v_problem[3]
                USING ERRCODE = 'P7004', COLUMN = v_problem[2], DETAIL = 'message index: -1';
        END IF;
        RAISE EXCEPTION '%: invalid message %: % %', v_caller, v_problem[1]::int - 1, v_problem[2], v_problem[3]
            USING ERRCODE = 'P7004', COLUMN = v_problem[2], DETAIL = format('message index: %s', v_problem[1]::int - 1);
    END IF;

    -- 3. Claim the dedupe keys, in key order; the lowest position wins a key
    --    repeated within the batch. Concurrent batches sharing keys lock them
    --    in the same order, so they cannot deadlock.
    IF p_dedupe_keys IS NOT NULL THEN
        INSERT INTO outbox.dedupe (namespace, topic, dedupe_key, message_id)
        SELECT e.ns, e.tp, e.dk, e.id
        FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_ids) WITH ORDINALITY AS e(ns, tp, dk, id, ord)
        WHERE e.dk IS NOT NULL
        ORDER BY e.ns, e.tp, e.dk, e.ord
        ON CONFLICT ON CONSTRAINT dedupe_pkey DO NOTHING;

        -- A new statement, so a new snapshot: keys that a concurrent
        -- transaction committed while we waited on them are visible here.
        v_inserted := ARRAY(
            SELECT d.message_id IS NULL OR d.message_id = e.id
            FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_ids) WITH ORDINALITY AS e(ns, tp, dk, id, ord)
            LEFT JOIN LATERAL (
                -- OFFSET 0 keeps this a per-message primary key probe: a
                -- hash join over the whole table is what stale statistics
                -- would choose on a table that grows by the batch.
                SELECT k.message_id FROM outbox.dedupe k
                WHERE k.namespace = e.ns AND k.topic = e.tp AND k.dedupe_key = e.dk OFFSET 0) d ON true
            ORDER BY e.ord);
    ELSE
        v_inserted := array_fill(true, ARRAY[v_n]);
    END IF;

    -- 4. Sequence ids for the inserted messages with an ordering key: each
    --    key's allocator moves once by its count, in key order. The row lock
    --    it takes serialises the key's producers until commit, so sequence
    --    order is commit order.
    IF p_ordering_keys IS NOT NULL THEN
        SELECT f.last_sequence_id INTO v_floor FROM outbox.sequence_floor f;
        WITH e AS (
            SELECT x.ns, x.ok, x.ord, row_number() OVER (PARTITION BY x.ns, x.ok ORDER BY x.ord) AS rank
            FROM unnest(p_namespaces, p_ordering_keys, v_inserted) WITH ORDINALITY AS x(ns, ok, ins, ord)
            WHERE x.ok IS NOT NULL AND x.ins
        ),
        counts AS (
            SELECT e.ns, e.ok, count(*) AS n FROM e GROUP BY e.ns, e.ok
        ),
        bumped AS (
            INSERT INTO outbox.sequences AS s (namespace, ordering_key, last_sequence_id)
            SELECT c.ns, c.ok, v_floor + c.n FROM counts c ORDER BY c.ns, c.ok
            ON CONFLICT ON CONSTRAINT sequences_pkey
                DO UPDATE SET last_sequence_id = s.last_sequence_id + (excluded.last_sequence_id - v_floor),
                              updated_at = now()
            RETURNING s.namespace, s.ordering_key, s.last_sequence_id
        )
        SELECT array_agg(CASE WHEN e.ok IS NULL THEN NULL ELSE b.last_sequence_id - c.n + e.rank END ORDER BY g.ord)
        INTO v_seqs
        FROM generate_series(1, v_n) AS g(ord)
        LEFT JOIN e ON e.ord = g.ord
        LEFT JOIN counts c ON c.ns = e.ns AND c.ok = e.ok
        LEFT JOIN bumped b ON b.namespace = e.ns AND b.ordering_key = e.ok;

        IF p_dedupe_keys IS NOT NULL THEN
            UPDATE outbox.dedupe d SET sequence_id = x.seq
            FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_seqs, v_inserted) AS x(ns, tp, dk, seq, ins)
            WHERE x.ins AND x.dk IS NOT NULL AND x.seq IS NOT NULL
              AND (d.namespace, d.topic, d.dedupe_key) = (x.ns, x.tp, x.dk);
        END IF;
    END IF;

    -- 5. The messages themselves. An ordered message starts behind; its
    --    key is settled when this transaction commits (the trigger on
    --    outbox.sequences), which makes it the head if it is first in line.
    INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                payload, payload_bytes, headers, trace_header, available_at, next_attempt_at, behind)
    SELECT x.id, x.ns, x.tp, x.tenant, x.dk, x.ok, x.seq, x.payload, octet_length(x.payload_text),
           coalesce(x.headers, '{}'::jsonb), x.trace,
           greatest(coalesce(x.at, v_now), v_now), greatest(coalesce(x.at, v_now), v_now), x.ok IS NOT NULL
    FROM unnest(v_ids, p_namespaces, p_topics, p_tenant_ids, p_dedupe_keys, p_ordering_keys, v_seqs,
                v_payloads, p_payloads, v_headers, p_trace_headers, p_available_at, v_inserted)
         AS x(id, ns, tp, tenant, dk, ok, seq, payload, payload_text, headers, trace, at, ins)
    WHERE x.ins;

    -- 6. One row per message, in order; a dedupe hit answers with the
    --    message that holds the key.
    RETURN QUERY
    SELECT CASE WHEN x.ins THEN x.id ELSE d.message_id END,
           CASE WHEN x.ins THEN x.seq ELSE d.sequence_id END,
           x.ins
    FROM unnest(v_ids, p_namespaces, p_topics, p_dedupe_keys, v_seqs, v_inserted) WITH ORDINALITY
         AS x(id, ns, tp, dk, seq, ins, ord)
    LEFT JOIN LATERAL (
        SELECT k.message_id, k.sequence_id FROM outbox.dedupe k
        WHERE NOT x.ins AND k.namespace = x.ns AND k.topic = x.tp AND k.dedupe_key = x.dk OFFSET 0) d ON true
    ORDER BY x.ord;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.enqueue(
    p_namespace    text,
    p_topic        text,
    p_payload      jsonb,
    p_tenant_id    text DEFAULT NULL,
    p_dedupe_key   text DEFAULT NULL,
    p_ordering_key text DEFAULT NULL,
    p_headers      jsonb DEFAULT '{}',
    p_trace_header text DEFAULT NULL,
    p_available_at timestamptz DEFAULT now())
RETURNS TABLE(message_id uuid, sequence_id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- One message: enqueue_batch() of a batch of one.
DECLARE
    -- While this is on, enqueue_batch's errors name outbox.enqueue and
    -- message index -1, as enqueue's always have. A setting rather than a
    -- parameter leaves enqueue_batch's signature the contract's. It is set
    -- here, not in a SET clause: only a superuser may create a function
    -- with a SET clause on a setting no extension defines, and RDS's master
    -- user is none. An error leaves it on only in a transaction or
    -- savepoint that is aborted, which resets it. Set by assignment: a
    -- PERFORM is a query, four times the cost.
    v_single text := set_config('outbox.enqueue_single', 'on', true);
BEGIN
    RETURN QUERY
    SELECT b.message_id, b.sequence_id, b.inserted
    FROM outbox.enqueue_batch(ARRAY[p_namespace], ARRAY[p_topic], ARRAY[p_payload::text],
                              ARRAY[p_tenant_id], ARRAY[p_dedupe_key], ARRAY[p_ordering_key],
                              ARRAY[p_headers::text], ARRAY[p_trace_header], ARRAY[p_available_at]) b;
    v_single := set_config('outbox.enqueue_single', 'off', true);
END;
$$;
-- +goose StatementEnd

DROP FUNCTION outbox.complete_batch(text, jsonb, int);
-- +goose StatementBegin
CREATE FUNCTION outbox.complete_batch(
    p_worker_id      text,
    p_results        jsonb,
    p_max_attempts   int DEFAULT 100,
    p_omit_ok        boolean DEFAULT false,
    p_ids            uuid[] DEFAULT NULL,
    p_lease_tokens   uuid[] DEFAULT NULL,
    p_outcomes       text[] DEFAULT NULL,
    p_error_codes    text[] DEFAULT NULL,
    p_error_messages text[] DEFAULT NULL,
    p_targets        text[] DEFAULT NULL,
    p_target_refs    text[] DEFAULT NULL,
    p_latencies_ms   int[] DEFAULT NULL,
    p_retry_at       timestamptz[] DEFAULT NULL,
    p_on_dead        text[] DEFAULT NULL,
    p_hold           boolean[] DEFAULT NULL)
RETURNS TABLE(id uuid, status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- The statements' plans must not depend on the statistics of pending,
-- which are often wrong here: taken while nothing was leased, they say no
-- row is leased to any worker, so a planner trusting them drives a join
-- from pending and reads the whole batch again for each of its rows. Each
-- statement finds pending's rows by primary key from the batch's ids, and
-- joins them with the results by hash (nested loops and merge joins are
-- off while it runs). Such a plan is right for any batch and any queue, so
-- it is made once per session; and never a scan of a table where an index
-- will do, since it may be made while pending is nearly empty. A statement
-- that touches a batch of rows by index never repays a JIT compilation.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
-- The results come either as one JSON document, p_results:
--   [{"id", "lease_token", "outcome", "error_code", "error_message",
--     "target", "target_ref", "latency_ms", "retry_at", "on_dead", "hold"}, ...]
-- or, with p_results NULL, as arrays of one element per result (element i
-- of each describing result i): p_ids, p_lease_tokens and p_outcomes, and
-- any of the others (NULL, or a NULL element, where a result has none).
-- The two forms mean exactly the same; the arrays cost the database and
-- the caller far less for a large batch.
--
--   DISPATCHED  archived, the row leaves pending
--   RETRYABLE   archived, lease cleared, due again at retry_at; moved to
--               dead instead at the attempt ceiling
--   FAILED      archived, the row moves to outbox.dead
--   RELEASED    given back untouched: lease cleared, the claim's attempt
--               taken back, nothing archived (the rest of an ordered run
--               after a message that was not delivered)
--
-- hold (true) marks a RETRYABLE outcome of a configuration failure (access
-- denied, a missing target or route): it is retried without end, never
-- dead-lettered at the attempt ceiling, since the message is not at fault.
--
-- on_dead ("skip" or "park") is the route's policy for an ordered message
-- that dies here or later (see outbox.requeue_expired_leases): "park" makes
-- the dead message hold its key.
--
-- Status per result, in the results' order: ok; lease_lost (not leased to
-- this worker under this token any more, or expired: nothing written for
-- it); dead (RETRYABLE at the ceiling, moved to dead); double_dispatch
-- (DISPATCHED for a message already recorded as dispatched: it leaves
-- pending without a second DISPATCHED outcome, and the rest of the batch is
-- recorded as usual). With p_omit_ok the results recorded as ok are left
-- out, so that a batch that went well answers with no rows. The outcomes
-- are archived in the results' order too.
--
-- A malformed batch (a result without id, lease_token or a valid outcome
-- or on_dead, an id given twice) is refused whole with P7003: nothing of
-- it is written.
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_nestloop text := current_setting('enable_nestloop');
    v_mergejoin text := current_setting('enable_mergejoin');
    v_recorded bigint;
    v_distinct int;
    v_invalid  int;
    -- The exceptions, in the results' order: ids, positions and statuses.
    v_ids      uuid[];
    v_ords     int[];
    v_statuses text[];
    v_all      text[];
    v_key_ns   text[];
    v_key_ok   text[];
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_worker_id must not be empty' USING ERRCODE = 'P7003';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_max_attempts must be at least 1' USING ERRCODE = '22023';
    END IF;
    IF p_results IS NOT NULL THEN
        IF num_nonnulls(p_ids, p_lease_tokens, p_outcomes, p_error_codes, p_error_messages, p_targets,
                        p_target_refs, p_latencies_ms, p_retry_at, p_on_dead, p_hold) > 0 THEN
            RAISE EXCEPTION 'outbox.complete_batch: the results come either as p_results or as arrays (p_ids, ...), not both'
                USING ERRCODE = 'P7003';
        END IF;
        IF jsonb_typeof(p_results) IS DISTINCT FROM 'array' THEN
            RAISE EXCEPTION 'outbox.complete_batch: p_results must be a JSON array of results' USING ERRCODE = 'P7003';
        END IF;
        -- The document becomes the arrays. This block only reads, so its
        -- subtransaction never takes a transaction id.
        BEGIN
            SELECT array_agg(r.id ORDER BY r.ord), array_agg(r.lease_token ORDER BY r.ord),
                   array_agg(r.outcome ORDER BY r.ord), array_agg(r.error_code ORDER BY r.ord),
                   array_agg(r.error_message ORDER BY r.ord), array_agg(r.target ORDER BY r.ord),
                   array_agg(r.target_ref ORDER BY r.ord), array_agg(r.latency_ms ORDER BY r.ord),
                   array_agg(r.retry_at ORDER BY r.ord), array_agg(r.on_dead ORDER BY r.ord),
                   array_agg(r.hold ORDER BY r.ord)
              INTO p_ids, p_lease_tokens, p_outcomes, p_error_codes, p_error_messages, p_targets,
                   p_target_refs, p_latencies_ms, p_retry_at, p_on_dead, p_hold
              FROM ROWS FROM (jsonb_to_recordset(p_results) AS (
                       id uuid, lease_token uuid, outcome text, error_code text, error_message text,
                       target text, target_ref text, latency_ms int, retry_at timestamptz, on_dead text, hold boolean))
                   WITH ORDINALITY AS r(id, lease_token, outcome, error_code, error_message,
                                        target, target_ref, latency_ms, retry_at, on_dead, hold, ord);
        EXCEPTION WHEN invalid_text_representation OR invalid_parameter_value OR datatype_mismatch
                    OR invalid_datetime_format OR datetime_field_overflow OR numeric_value_out_of_range THEN
            RAISE EXCEPTION 'outbox.complete_batch: malformed result document: %', SQLERRM USING ERRCODE = 'P7003';
        END;
    ELSIF p_ids IS NULL THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_results must be a JSON array of results (or NULL, with the results as arrays in p_ids, ...)'
            USING ERRCODE = 'P7003';
    ELSIF p_lease_tokens IS NULL OR p_outcomes IS NULL
          OR cardinality(p_ids) <> ANY (ARRAY[cardinality(p_lease_tokens), cardinality(p_outcomes),
                                              cardinality(p_error_codes), cardinality(p_error_messages),
                                              cardinality(p_targets), cardinality(p_target_refs),
                                              cardinality(p_latencies_ms), cardinality(p_retry_at),
                                              cardinality(p_on_dead), cardinality(p_hold)]) THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_lease_tokens, p_outcomes and every other result array given must have one element per id (% ids)',
            cardinality(p_ids) USING ERRCODE = 'P7003';
    END IF;
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;

    -- The DELETE and the UPDATEs are the fence: each touches only rows still
    -- leased to this worker under the result's token and not yet expired
    -- (by the clock now, not the transaction's start). A row that a reaper
    -- or another worker changed meanwhile fails the re-check PostgreSQL
    -- makes after waiting for its lock, and is left alone: lease_lost.
    --
    -- Almost every batch is all DISPATCHED: it runs the first statement,
    -- which is the second one's DISPATCHED part alone (the other outcomes'
    -- statements cost a tenth of the call even when they find nothing).
    -- In both, the exceptions (lease_lost, dead, double_dispatch) are looked
    -- for only when the counts of what was written say there are any.
    PERFORM set_config('enable_nestloop', 'off', true), set_config('enable_mergejoin', 'off', true);
    IF p_outcomes <@ ARRAY['DISPATCHED'] THEN
        WITH removed AS (
            DELETE FROM outbox.pending p
            USING unnest(p_ids, p_lease_tokens, p_error_codes, p_error_messages, p_targets, p_target_refs,
                         p_latencies_ms)
                  WITH ORDINALITY AS r(id, lease_token, error_code, error_message, target, target_ref,
                                       latency_ms, ord)
            WHERE p.id = ANY (p_ids)
              AND p.id = r.id
              AND p.lease_token = r.lease_token
              AND p.claimed_by = p_worker_id
              AND p.lease_expires_at > v_now
            RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                      p.attempt_count, r.error_code, left(r.error_message, 4096) AS error_message,
                      r.target, r.target_ref, r.latency_ms, r.ord
        ),
        -- The double-delivery backstop, per message: a second DISPATCHED
        -- for a message is not archived (attempts_one_dispatched_per_message),
        -- and only that message says so. The outcomes are archived in the
        -- results' order, whatever order the join found the rows in: a run's
        -- messages in sequence order, as they were delivered.
        archived AS (
            INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                         dedupe_key, ordering_key, sequence_id, target, target_ref,
                                         error_code, error_message, latency_ms)
            SELECT x.id, x.attempt_count, 'DISPATCHED', p_worker_id, x.namespace, x.topic, x.tenant_id,
                   x.dedupe_key, x.ordering_key, x.sequence_id, x.target, x.target_ref,
                   x.error_code, x.error_message, x.latency_ms
            FROM removed x
            ORDER BY x.ord
            ON CONFLICT (message_id) WHERE state = 'DISPATCHED' DO NOTHING
            RETURNING message_id
        ),
        tally AS (
            SELECT (SELECT count(*) FROM removed) AS removed, (SELECT count(*) FROM archived) AS archived
        ),
        exceptions AS (
            SELECT r.id, r.ord, 'lease_lost' AS status
            FROM unnest(p_ids) WITH ORDINALITY AS r(id, ord)
            WHERE (SELECT t.removed < cardinality(p_ids) FROM tally t)
              AND r.id NOT IN (SELECT x.id FROM removed x)
            UNION ALL
            SELECT x.id, x.ord, 'double_dispatch'
            FROM removed x
            WHERE (SELECT t.archived < t.removed FROM tally t)
              AND x.id NOT IN (SELECT a.message_id FROM archived a)
        )
        SELECT t.removed, e.ids, e.ords, e.statuses, k.namespaces, k.keys
          INTO v_recorded, v_ids, v_ords, v_statuses, v_key_ns, v_key_ok
          FROM tally t,
               (SELECT array_agg(e.id ORDER BY e.ord) AS ids, array_agg(e.ord::int ORDER BY e.ord) AS ords,
                       array_agg(e.status ORDER BY e.ord) AS statuses
                FROM exceptions e) e,
               (SELECT array_agg(x.namespace) AS namespaces, array_agg(x.ordering_key) AS keys
                FROM removed x WHERE x.ordering_key IS NOT NULL) k;
    ELSE
        -- The statements of outcomes absent from the batch are skipped
        -- whole (a one-time filter on the outcomes).
        WITH
        -- DISPATCHED and FAILED leave pending; so does a RETRYABLE outcome
        -- at the attempt ceiling, which becomes FAILED.
        removed AS (
            DELETE FROM outbox.pending p
            USING unnest(p_ids, p_lease_tokens, p_outcomes, p_error_codes, p_error_messages,
                         p_targets, p_target_refs, p_latencies_ms, p_on_dead, p_hold)
                  WITH ORDINALITY AS r(id, lease_token, outcome, error_code, error_message,
                                       target, target_ref, latency_ms, on_dead, hold, ord)
            WHERE p.id = ANY (p_ids)
              AND p.id = r.id
              AND p.lease_token = r.lease_token
              AND p.claimed_by = p_worker_id
              AND p.lease_expires_at > v_now
              AND (r.outcome IN ('DISPATCHED', 'FAILED')
                   OR (r.outcome = 'RETRYABLE' AND p.attempt_count >= p_max_attempts AND NOT coalesce(r.hold, false)))
            -- A delivered row's payload is not needed past this point:
            -- carrying it through the CTEs costs more than the delete itself.
            RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                      CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.payload END AS payload,
                      p.payload_bytes,
                      CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.headers END AS headers,
                      p.trace_header, p.attempt_count, p.available_at, p.created_at,
                      r.outcome AS requested,
                      CASE WHEN r.outcome = 'DISPATCHED' THEN 'DISPATCHED' ELSE 'FAILED' END AS outcome,
                      p.ordering_key IS NOT NULL AND r.outcome <> 'DISPATCHED'
                          AND coalesce(r.on_dead = 'park', p.park_on_dead) AS parks,
                      r.error_code, left(r.error_message, 4096) AS error_message, r.target, r.target_ref,
                      r.latency_ms, r.ord
        ),
        rescheduled AS (
            UPDATE outbox.pending p
            SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
                next_attempt_at = greatest(coalesce(r.retry_at, v_now), v_now),
                last_error_code = r.error_code,
                last_error = left(r.error_message, 4096),
                failing_since = coalesce(p.failing_since, v_now),
                park_on_dead = coalesce(r.on_dead = 'park', p.park_on_dead)
            FROM unnest(p_ids, p_lease_tokens, p_outcomes, p_error_codes, p_error_messages,
                        p_targets, p_target_refs, p_latencies_ms, p_retry_at, p_on_dead, p_hold)
                 WITH ORDINALITY AS r(id, lease_token, outcome, error_code, error_message,
                                      target, target_ref, latency_ms, retry_at, on_dead, hold, ord)
            WHERE 'RETRYABLE' = ANY (p_outcomes)
              AND p.id = ANY (p_ids)
              AND p.id = r.id
              AND p.lease_token = r.lease_token
              AND p.claimed_by = p_worker_id
              AND p.lease_expires_at > v_now
              AND r.outcome = 'RETRYABLE' AND (p.attempt_count < p_max_attempts OR coalesce(r.hold, false))
            RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                      p.attempt_count, r.error_code, left(r.error_message, 4096) AS error_message,
                      r.target, r.target_ref, r.latency_ms, r.ord
        ),
        released AS (
            UPDATE outbox.pending p
            SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
                attempt_count = greatest(p.attempt_count - 1, 0)
            FROM unnest(p_ids, p_lease_tokens, p_outcomes) AS r(id, lease_token, outcome)
            WHERE 'RELEASED' = ANY (p_outcomes)
              AND p.id = ANY (p_ids)
              AND p.id = r.id
              AND p.lease_token = r.lease_token
              AND p.claimed_by = p_worker_id
              AND p.lease_expires_at > v_now
              AND r.outcome = 'RELEASED'
            RETURNING p.id
        ),
        buried AS (
            INSERT INTO outbox.dead (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                     payload, payload_bytes, headers, trace_header, attempt_count, available_at,
                                     created_at, last_error_code, last_error, failed_by, holds_key)
            SELECT x.id, x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id,
                   x.payload, x.payload_bytes, x.headers, x.trace_header, x.attempt_count, x.available_at,
                   x.created_at, x.error_code, x.error_message, p_worker_id,
                   -- Only a key's first dead message holds it (a run stops at
                   -- its first failure, so there is no second; this keeps it so).
                   x.parks AND x.rank = 1
                       AND NOT EXISTS (SELECT 1 FROM outbox.dead d
                                       WHERE d.namespace = x.namespace AND d.ordering_key = x.ordering_key AND d.holds_key)
            FROM (SELECT y.*, row_number() OVER (PARTITION BY y.namespace, y.ordering_key, y.outcome ORDER BY y.sequence_id) AS rank
                  FROM removed y) x
            WHERE p_outcomes && ARRAY['FAILED', 'RETRYABLE'] AND x.outcome = 'FAILED'
        ),
        -- The double-delivery backstop, as above.
        archived AS (
            INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                         dedupe_key, ordering_key, sequence_id, target, target_ref,
                                         error_code, error_message, latency_ms)
            SELECT y.id, y.attempt_count, y.outcome, p_worker_id, y.namespace, y.topic, y.tenant_id,
                   y.dedupe_key, y.ordering_key, y.sequence_id, y.target, y.target_ref,
                   y.error_code, y.error_message, y.latency_ms
            FROM (SELECT x.id, x.attempt_count, x.outcome, x.namespace, x.topic, x.tenant_id, x.dedupe_key,
                         x.ordering_key, x.sequence_id, x.target, x.target_ref, x.error_code, x.error_message,
                         x.latency_ms, x.ord
                  FROM removed x
                  UNION ALL
                  SELECT q.id, q.attempt_count, 'RETRYABLE', q.namespace, q.topic, q.tenant_id, q.dedupe_key,
                         q.ordering_key, q.sequence_id, q.target, q.target_ref, q.error_code, q.error_message,
                         q.latency_ms, q.ord
                  FROM rescheduled q) y
            ORDER BY y.ord
            ON CONFLICT (message_id) WHERE state = 'DISPATCHED' DO NOTHING
            RETURNING message_id, state
        ),
        tally AS (
            SELECT (SELECT count(*) FROM removed) AS removed, (SELECT count(*) FROM rescheduled) AS rescheduled,
                   (SELECT count(*) FROM released) AS released, (SELECT count(*) FROM archived) AS archived
        ),
        exceptions AS (
            SELECT r.id, r.ord, 'lease_lost' AS status
            FROM unnest(p_ids) WITH ORDINALITY AS r(id, ord)
            WHERE (SELECT t.removed + t.rescheduled + t.released < cardinality(p_ids) FROM tally t)
              AND r.id NOT IN (SELECT x.id FROM removed x UNION ALL SELECT q.id FROM rescheduled q
                               UNION ALL SELECT l.id FROM released l)
            UNION ALL
            SELECT x.id, x.ord, 'dead'
            FROM removed x
            WHERE 'RETRYABLE' = ANY (p_outcomes) AND x.requested = 'RETRYABLE'
            UNION ALL
            -- Only a DISPATCHED outcome can fail to be archived.
            SELECT x.id, x.ord, 'double_dispatch'
            FROM removed x
            WHERE (SELECT t.archived < t.removed + t.rescheduled FROM tally t)
              AND x.outcome = 'DISPATCHED'
              AND x.id NOT IN (SELECT a.message_id FROM archived a WHERE a.state = 'DISPATCHED')
        )
        SELECT t.removed + t.rescheduled + t.released, e.ids, e.ords, e.statuses, k.namespaces, k.keys
          INTO v_recorded, v_ids, v_ords, v_statuses, v_key_ns, v_key_ok
          FROM tally t,
               (SELECT array_agg(e.id ORDER BY e.ord) AS ids, array_agg(e.ord::int ORDER BY e.ord) AS ords,
                       array_agg(e.status ORDER BY e.ord) AS statuses
                FROM exceptions e) e,
               (SELECT array_agg(x.namespace) AS namespaces, array_agg(x.ordering_key) AS keys
                FROM removed x WHERE x.ordering_key IS NOT NULL) k;
    END IF;

    PERFORM set_config('enable_nestloop', v_nestloop, true), set_config('enable_mergejoin', v_mergejoin, true);

    -- The batch is checked here, after the statement, from what it wrote: a
    -- result without id, token or a valid outcome matches no row, and a
    -- repeated id matches its row twice, which PostgreSQL changes once; so
    -- when every result was recorded, none of them is malformed, and the
    -- results are read again only when some were not. The RAISE aborts the
    -- call, and with it everything the statement wrote, so a malformed
    -- batch never half-applies.
    IF v_recorded < cardinality(p_ids)
       OR NOT coalesce(array_remove(p_on_dead, NULL) <@ ARRAY['skip', 'park'], true) THEN
        SELECT count(*) FILTER (WHERE x.id IS NULL OR x.lease_token IS NULL OR x.outcome IS NULL
                                   OR x.outcome NOT IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'RELEASED')
                                   OR (x.on_dead IS NOT NULL AND x.on_dead NOT IN ('skip', 'park'))),
               count(DISTINCT x.id)
          INTO v_invalid, v_distinct
          FROM unnest(p_ids, p_lease_tokens, p_outcomes, p_on_dead) AS x(id, lease_token, outcome, on_dead);
        IF v_invalid > 0 THEN
            RAISE EXCEPTION 'outbox.complete_batch: % result(s) without id, lease_token or a valid outcome (DISPATCHED, RETRYABLE, FAILED, RELEASED) and on_dead (skip, park)', v_invalid
                USING ERRCODE = 'P7003';
        END IF;
        IF v_distinct <> cardinality(p_ids) THEN
            RAISE EXCEPTION 'outbox.complete_batch: a message id appears more than once in one batch' USING ERRCODE = 'P7003';
        END IF;
    END IF;

    -- A key whose message left pending has a new head (or is parked); a key
    -- a producer is committing to right now is left to the next claim.
    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, false);
    END IF;

    IF p_omit_ok THEN
        RETURN QUERY SELECT u.id, u.status FROM unnest(v_ids, v_statuses) AS u(id, status);
    ELSE
        v_all := array_fill('ok'::text, ARRAY[cardinality(p_ids)]);
        FOR i IN 1 .. coalesce(cardinality(v_ords), 0) LOOP
            v_all[v_ords[i]] := v_statuses[i];
        END LOOP;
        RETURN QUERY SELECT u.id, u.status FROM unnest(p_ids, v_all) AS u(id, status);
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- requeue_expired_leases takes over leases that expired by p_now, oldest
-- first: p_limit rows of the namespaces p_namespaces (NULL: all), and the
-- rest of any ordered run the limit cut, since a run is taken over whole.
-- Each row is due at p_now again with its lease cleared (a head stays its
-- key's head), and a ZOMBIE_REQUEUE naming the lease's holder is archived
-- under p_worker_id; at the attempt ceiling p_max_attempts the row is
-- dead-lettered as LEASE_EXPIRED instead, parking its key if the route said
-- so when it last reported on the message. Returns the rows it took over.
-- The one place a lease is taken over: the reaper (repair_expired_leases)
-- and every claim (claim_batch) call it. Not executable by any runtime
-- role; they call it as its owner.
--
-- One taker per key. An ordered run is taken over by whoever first locks
-- its key's row in outbox.keys (SKIP LOCKED: a key another taker holds is
-- left to it), so that two takers never split a run between them; a split
-- would let a claim lease the key's head anew while the rest of the run
-- still holds the old lease. A claim leases all its rows under one token
-- and one expiry, and nothing moves an expiry afterwards, so a lease's rows
-- are found in pending_lease_expiry by the two, whatever the key's backlog.
CREATE FUNCTION outbox.requeue_expired_leases(
    p_limit        int,
    p_worker_id    text,
    p_max_attempts int,
    p_now          timestamptz,
    p_namespaces   text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- Expired leases and their runs, by index, whatever the statistics say:
-- see outbox.claim_batch.
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_loose    uuid[];
    v_ns       text[];
    v_ok       text[];
    v_tokens   uuid[];
    v_expiry   timestamptz[];
    v_owned    text[];
    v_ids      uuid[];
    v_repaired integer;
    v_key_ns   text[];
    v_key_ok   text[];
BEGIN
    -- 1. The oldest expired leases, read without locking: a row another
    --    taker holds is skipped below, and so is a key.
    SELECT array_agg(c.id) FILTER (WHERE c.ordering_key IS NULL),
           array_agg(c.namespace) FILTER (WHERE c.ordering_key IS NOT NULL),
           array_agg(c.ordering_key) FILTER (WHERE c.ordering_key IS NOT NULL),
           array_agg(c.lease_token) FILTER (WHERE c.ordering_key IS NOT NULL),
           array_agg(c.lease_expires_at) FILTER (WHERE c.ordering_key IS NOT NULL)
      INTO v_loose, v_ns, v_ok, v_tokens, v_expiry
      FROM (SELECT p.id, p.namespace, p.ordering_key, p.lease_token, p.lease_expires_at
            FROM outbox.pending p
            WHERE p.lease_token IS NOT NULL AND p.attempt_count >= 0 AND p.lease_expires_at <= p_now
              AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
            ORDER BY p.lease_expires_at
            LIMIT p_limit) c;

    -- 2. Unordered rows, locked one by one; ordered runs, each whole under
    --    its key's lock (see above).
    v_ids := ARRAY(
        SELECT p.id FROM outbox.pending p
        WHERE p.id = ANY (v_loose) AND p.lease_token IS NOT NULL AND p.lease_expires_at <= p_now
        FOR UPDATE OF p SKIP LOCKED);
    IF v_ns IS NOT NULL THEN
        -- A key as one text, for the hashed = ANY below: its namespace's
        -- length first, so that no two keys read the same.
        v_owned := ARRAY(
            SELECT octet_length(k.namespace) || ':' || k.namespace || k.ordering_key
            FROM outbox.keys k
            WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(v_ns, v_ok))
            ORDER BY k.namespace, k.ordering_key
            FOR UPDATE SKIP LOCKED);
        -- Each lease read once, by its expiry, for the runs of the keys
        -- taken.
        v_ids := v_ids || ARRAY(
            SELECT q.id FROM outbox.pending q
            WHERE q.lease_token IS NOT NULL AND q.attempt_count >= 0 AND q.lease_expires_at = ANY (v_expiry)
              AND q.lease_token = ANY (v_tokens)
              AND octet_length(q.namespace) || ':' || q.namespace || q.ordering_key = ANY (v_owned)
            FOR UPDATE OF q SKIP LOCKED);
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;

    -- 3. Requeued, or dead at the ceiling; archived either way.
    WITH expired AS (
        SELECT p.id, p.claimed_by AS held_by
        FROM outbox.pending p
        WHERE p.id = ANY (v_ids) AND p.lease_token IS NOT NULL AND p.lease_expires_at <= p_now
    ),
    requeued AS (
        UPDATE outbox.pending p
        SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_attempt_at = p_now,
            last_error_code = 'LEASE_EXPIRED',
            last_error = 'lease held by ' || e.held_by || ' expired before completion'
        FROM expired e
        WHERE p.id = e.id AND p.attempt_count < p_max_attempts
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  p.attempt_count, e.held_by
    ),
    -- A message whose every attempt ends in a crash (it kills the
    -- dispatcher, or outlives the lease) must not loop for ever.
    removed AS (
        DELETE FROM outbox.pending p
        USING expired e
        WHERE p.id = e.id AND p.attempt_count >= p_max_attempts
        RETURNING p.*, e.held_by
    ),
    buried AS (
        INSERT INTO outbox.dead (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                 payload, payload_bytes, headers, trace_header, attempt_count, available_at,
                                 created_at, last_error_code, last_error, failed_by, holds_key)
        SELECT x.id, x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id,
               x.payload, x.payload_bytes, x.headers, x.trace_header, x.attempt_count, x.available_at,
               x.created_at, 'LEASE_EXPIRED',
               'lease held by ' || x.held_by || ' expired on attempt ' || x.attempt_count
                   || ', the attempt ceiling; moved to dead',
               p_worker_id,
               -- The key's first message to die here holds it, if the
               -- route parks (one claim per key: there is no other).
               x.ordering_key IS NOT NULL AND x.park_on_dead AND x.rank = 1
                   AND NOT EXISTS (SELECT 1 FROM outbox.dead d
                                   WHERE d.namespace = x.namespace AND d.ordering_key = x.ordering_key AND d.holds_key)
        FROM (SELECT y.*, row_number() OVER (PARTITION BY y.namespace, y.ordering_key ORDER BY y.sequence_id) AS rank
              FROM removed y) x
    ),
    archived AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                     dedupe_key, ordering_key, sequence_id, error_code, error_message)
        SELECT q.id, q.attempt_count, 'ZOMBIE_REQUEUE', p_worker_id, q.namespace, q.topic, q.tenant_id,
               q.dedupe_key, q.ordering_key, q.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || q.held_by || ' expired before completion'
        FROM requeued q
        UNION ALL
        SELECT x.id, x.attempt_count, 'FAILED', p_worker_id, x.namespace, x.topic, x.tenant_id,
               x.dedupe_key, x.ordering_key, x.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || x.held_by || ' expired on attempt ' || x.attempt_count
                   || ', the attempt ceiling; moved to dead'
        FROM removed x
    )
    SELECT (SELECT count(*) FROM requeued) + (SELECT count(*) FROM removed),
           (SELECT array_agg(x.namespace) FROM removed x WHERE x.ordering_key IS NOT NULL),
           (SELECT array_agg(x.ordering_key) FROM removed x WHERE x.ordering_key IS NOT NULL)
      INTO v_repaired, v_key_ns, v_key_ok;

    -- A key whose message died here has a new head, or is parked (its lock
    -- is already this transaction's).
    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, false);
    END IF;
    RETURN v_repaired;
END;
$$;
-- +goose StatementEnd

DROP FUNCTION outbox.claim_batch(int, text, int, text[]);
-- +goose StatementBegin
CREATE FUNCTION outbox.claim_batch(
    p_batch_size        int,
    p_worker_id         text,
    p_lease_seconds     int,
    p_namespaces        text[] DEFAULT NULL,
    p_max_run           int DEFAULT 1,
    p_max_bytes         bigint DEFAULT NULL,
    p_max_payload_bytes int DEFAULT NULL,
    p_max_attempts      int DEFAULT 100)
RETURNS TABLE(id uuid, namespace text, topic text, tenant_id text, dedupe_key text,
              ordering_key text, sequence_id bigint, payload jsonb, headers jsonb,
              trace_header text, attempt_count int, lease_token uuid,
              lease_expires_at timestamptz, created_at timestamptz, payload_bytes int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- One plan per statement and session: planning afresh on every call cost a
-- hot key's claim of 100 more than running it (2.0 ms against 1.5 ms with
-- the plan cached). A generic plan cannot see the LIMIT, and would walk the
-- queue and sort it; with sequential scans and sorts refused below, every
-- statement is planned as the walk of its index that it must be (the claim
-- index in (next_attempt_at, id) order, a key's run in sequence order, the
-- lease by primary key), whatever the statistics said when it was planned.
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
-- Every statement here reads at most p_batch_size heads and their runs by
-- index, which a JIT compilation (tens of milliseconds, not cached between
-- calls) never repays. The planner cannot know that: it estimates the runs
-- behind the heads from the table's statistics, and one long key (a stuck
-- head with its backlog) lifts the estimate past jit_above_cost.
SET jit = off
-- Its statements find rows by index (the claim index, a key's run, the
-- lease by primary key); statistics taken while pending was nearly empty
-- made the lease's UPDATE ... WHERE id = ANY scan the whole queue.
SET enable_seqscan = off
AS $$
-- Claims up to p_batch_size messages: due heads and unordered messages in
-- (next_attempt_at, id) order, each ordered head followed by up to
-- p_max_run - 1 of the messages queued behind it (its run, in sequence
-- order, stopping at the first that is not due, leased or lockable), all
-- under one lease token. The claim stops before its payloads would exceed
-- p_max_bytes (it always takes at least one message). A message whose
-- payload is larger than p_max_payload_bytes (the most any route may send)
-- is claimed without its payload (NULL) and does not count against
-- p_max_bytes: the dispatcher dead-letters it without loading it.
--
-- Takeover. Leases of p_namespaces that expired (a dispatcher crashed or
-- overran) are taken over first, up to p_batch_size rows and the rest of
-- any ordered run the limit cut (a run goes whole), exactly as the reaper
-- does (outbox.requeue_expired_leases, with p_max_attempts the attempt
-- ceiling): a ZOMBIE_REQUEUE each, naming the holder, or a LEASE_EXPIRED
-- dead letter at the ceiling. They are due now, so this claim may take
-- them back at once. Without an expired lease this costs one probe of
-- pending_lease_expiry.
--
-- Cost. The heads are locked as an unordered claim locks its rows (up to
-- p_batch_size of them); the runs are read and locked only as far as the
-- batch takes them: 40 keys of 25 fill a batch of 1000 whatever number of
-- heads are due. A head locked but not taken is left as it was (a
-- concurrent claim skips it until this one commits).
#variable_conflict use_column
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_token   uuid := gen_random_uuid();
    v_ids     uuid[];
    v_ordered boolean;
    v_heads   uuid[];
    v_ns      text[];
    v_keys    text[];
    v_seqs    bigint[];
    v_bytes   int[];
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 10000 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_batch_size must be between 1 and 10000, got %', p_batch_size
            USING ERRCODE = '22023';
    END IF;
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_worker_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF p_lease_seconds IS NULL OR p_lease_seconds < 1 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_lease_seconds must be at least 1, got %', p_lease_seconds
            USING ERRCODE = '22023';
    END IF;
    IF p_max_run IS NULL OR p_max_run < 1 OR p_max_run > 10000 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_max_run must be between 1 and 10000, got %', p_max_run
            USING ERRCODE = '22023';
    END IF;
    IF p_max_bytes < 1 OR p_max_payload_bytes < 1 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_max_bytes and p_max_payload_bytes must be positive (or NULL), got % and %',
            p_max_bytes, p_max_payload_bytes USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_max_attempts must be at least 1, got %', p_max_attempts
            USING ERRCODE = '22023';
    END IF;

    -- Expired leases, taken over (see "Takeover" above). Almost never any.
    IF EXISTS (SELECT 1 FROM outbox.pending p
               WHERE p.lease_token IS NOT NULL AND p.attempt_count >= 0 AND p.lease_expires_at <= v_now
                 AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))) THEN
        PERFORM outbox.requeue_expired_leases(p_batch_size, p_worker_id, p_max_attempts, v_now, p_namespaces);
    END IF;

    -- Keys a dispatcher could not settle without waiting: settle them now,
    -- so that their heads are claimable. Almost always empty.
    IF EXISTS (SELECT 1 FROM outbox.unsettled_keys) THEN
        PERFORM outbox.settle_unsettled(100);
    END IF;

    -- 1. The heads, locked until commit. Without an ordered head among
    --    them (or with runs of one) they are the claim, up to the byte
    --    budget; the arrays describe them, aligned, for the steps below.
    WITH heads AS (
        SELECT p.id, p.namespace, p.ordering_key, p.sequence_id, p.payload_bytes, p.next_attempt_at
        FROM outbox.pending p
        WHERE p.lease_token IS NULL
          AND NOT p.behind
          AND p.next_attempt_at <= v_now
          AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
        ORDER BY p.next_attempt_at, p.id
        LIMIT p_batch_size
        FOR UPDATE OF p SKIP LOCKED
    ),
    ranked AS (
        SELECT h.id, h.namespace, h.ordering_key, h.sequence_id, h.payload_bytes,
               row_number() OVER w AS n,
               sum(CASE WHEN h.payload_bytes > p_max_payload_bytes THEN 0 ELSE h.payload_bytes END) OVER w AS bytes
        FROM heads h
        WINDOW w AS (ORDER BY h.next_attempt_at, h.id)
    )
    SELECT array_agg(r.id) FILTER (WHERE r.n = 1 OR p_max_bytes IS NULL OR r.bytes <= p_max_bytes),
           coalesce(bool_or(r.ordering_key IS NOT NULL), false) AND p_max_run > 1,
           array_agg(r.id), array_agg(r.namespace), array_agg(r.ordering_key),
           array_agg(r.sequence_id), array_agg(r.payload_bytes)
      INTO v_ids, v_ordered, v_heads, v_ns, v_keys, v_seqs, v_bytes
      FROM ranked r;

    -- 2. Per-entity keys, one message each, have nothing behind their
    --    heads: then the heads are the claim all the same. One probe of
    --    pending_key_sequence per ordered head (an index-only scan) finds
    --    out, and the first head with a message behind it ends the search.
    IF v_ordered THEN
        v_ordered := EXISTS (
            SELECT 1 FROM unnest(v_ns, v_keys, v_seqs) AS h(namespace, ordering_key, sequence_id)
            WHERE h.ordering_key IS NOT NULL
              AND EXISTS (SELECT 1 FROM outbox.pending q
                          WHERE q.namespace = h.namespace AND q.ordering_key = h.ordering_key
                            AND q.sequence_id > h.sequence_id));
    END IF;

    -- 3. The runs. The heads in order, each followed by its run, under a
    --    LIMIT of the batch: the nested loop expands a head only when the
    --    rows before it did not fill the batch, so the keys behind the
    --    batch's last run cost nothing, and a follower is locked only when
    --    its run is expanded. A run reads its followers in sequence order
    --    and stops at the first that is not due or leased: the window's
    --    run condition ends the scan there. One that another transaction
    --    holds (an operator discarding it) ends the run too, though the
    --    scan goes on past it.
    IF v_ordered THEN
        v_ids := ARRAY(
        WITH expanded AS MATERIALIZED (
            SELECT h.i, r.k, r.id, r.payload_bytes
            FROM unnest(v_heads, v_ns, v_keys, v_seqs, v_bytes)
                 WITH ORDINALITY AS h(id, namespace, ordering_key, sequence_id, payload_bytes, i)
            CROSS JOIN LATERAL (
                SELECT h.id, 0::bigint AS k, h.payload_bytes
                UNION ALL
                SELECT f.id, f.k, f.payload_bytes
                FROM (
                    SELECT q.id, q.ctid, q.payload_bytes,
                           row_number() OVER w AS k,
                           count(*) FILTER (WHERE q.lease_token IS NOT NULL OR q.next_attempt_at > v_now) OVER w AS misses
                    FROM (SELECT q.id, q.ctid, q.sequence_id, q.payload_bytes, q.lease_token, q.next_attempt_at
                          FROM outbox.pending q
                          WHERE q.namespace = h.namespace AND q.ordering_key = h.ordering_key
                            AND q.sequence_id > h.sequence_id
                          ORDER BY q.sequence_id
                          LIMIT p_max_run - 1) q
                    WINDOW w AS (ORDER BY q.sequence_id ROWS UNBOUNDED PRECEDING)
                ) f
                -- Locked once it is known to be taken (a window reads a row
                -- ahead); one that cannot be locked leaves a gap in k.
                -- Found by the ctid just read rather than through
                -- pending_pkey: the same row without an index descent.
                CROSS JOIN LATERAL (
                    SELECT x.id FROM outbox.pending x
                    WHERE x.ctid = f.ctid AND x.id = f.id
                    FOR UPDATE SKIP LOCKED) l
                WHERE f.misses = 0
            ) r
            LIMIT p_batch_size
        ),
        -- Each run is taken only as far as it is unbroken from the head
        -- (k = 0, 1, 2, ...): up to a follower that could not be locked,
        -- and up to where the LIMIT cut, whatever order the rows came in.
        -- A key's share of the claim is always a prefix of its run.
        unbroken AS (
            SELECT e.i, e.k, e.id, e.payload_bytes,
                   e.k = row_number() OVER (PARTITION BY e.i ORDER BY e.k) - 1 AS prefix
            FROM expanded e
        ),
        ranked AS (
            SELECT u.id, row_number() OVER w AS n,
                   sum(CASE WHEN u.payload_bytes > p_max_payload_bytes THEN 0 ELSE u.payload_bytes END) OVER w AS bytes
            FROM unbroken u
            WHERE u.prefix
            WINDOW w AS (ORDER BY u.i, u.k)
        )
        SELECT r.id FROM ranked r
        WHERE r.n <= p_batch_size AND (r.n = 1 OR p_max_bytes IS NULL OR r.bytes <= p_max_bytes));
    END IF;

    -- The lease, by primary key: joining the chosen rows instead lets the
    -- planner hash them against a sequential scan of the whole queue.
    RETURN QUERY
    UPDATE outbox.pending p
    SET claimed_by       = p_worker_id,
        lease_token      = v_token,
        lease_expires_at = v_now + make_interval(secs => p_lease_seconds),
        attempt_count    = p.attempt_count + 1
    WHERE p.id = ANY (v_ids)
    RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
              CASE WHEN p.payload_bytes > p_max_payload_bytes THEN NULL ELSE p.payload END,
              p.headers, p.trace_header, p.attempt_count, p.lease_token,
              p.lease_expires_at, p.created_at, p.payload_bytes;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.claimable_estimate(
    p_limit      int,
    p_namespaces text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Custom plans see the LIMIT and the namespaces, as claim_batch's do.
SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off
SET jit = off
AS $$
-- What claims of p_namespaces (NULL: all) could take now, counted up to
-- p_limit: due unleased heads and unordered messages, by the claim's own
-- index (pending_claimable), then expired leases, which a claim takes over
-- first, by pending_lease_expiry. A due key counts once, by its head,
-- whatever the run behind it: one claim at a time works a key, so heads are
-- what more claimers can share; an expired lease counts each of its rows.
-- It reads at most p_limit entries of each index and no other rows (with
-- namespaces, the other namespaces' entries among them are read and
-- skipped, as the claim does). Rows that uncommitted claims hold still
-- count: it is an estimate for deciding how many dispatchers to start, not
-- a promise.
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_due     bigint;
    v_expired bigint := 0;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000000 THEN
        RAISE EXCEPTION 'outbox.claimable_estimate: p_limit must be between 1 and 1000000, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    SELECT count(*) INTO v_due
    FROM (SELECT 1 FROM outbox.pending p
          WHERE p.lease_token IS NULL AND NOT p.behind AND p.next_attempt_at <= v_now
            AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
          LIMIT p_limit) x;
    IF v_due < p_limit THEN
        SELECT count(*) INTO v_expired
        FROM (SELECT 1 FROM outbox.pending p
              WHERE p.lease_token IS NOT NULL AND p.attempt_count >= 0 AND p.lease_expires_at <= v_now
                AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
              LIMIT p_limit - v_due) x;
    END IF;
    RETURN v_due + v_expired;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.repair_expired_leases(
    p_batch_size   int,
    p_worker_id    text,
    p_max_attempts int DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- At most p_batch_size expired leases and their runs, by index: see
-- claim_batch.
SET jit = off
AS $$
-- The reaper: takes over up to p_batch_size expired leases (by the clock
-- now, not the transaction's start) as outbox.requeue_expired_leases does,
-- with an ordered run repaired whole. Claims take over expired leases too;
-- the reaper is the sweeper for the namespaces nobody claims. Also settles
-- the keys dispatchers had to leave unsettled.
DECLARE
    v_repaired integer;
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 100000 THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_batch_size must be between 1 and 100000, got %', p_batch_size
            USING ERRCODE = '22023';
    END IF;
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_worker_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_max_attempts must be at least 1, got %', p_max_attempts
            USING ERRCODE = '22023';
    END IF;

    v_repaired := outbox.requeue_expired_leases(p_batch_size, p_worker_id, p_max_attempts, clock_timestamp(), NULL);
    PERFORM outbox.settle_unsettled(1000);
    RETURN v_repaired;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.replay_dead(
    p_message_ids   uuid[] DEFAULT NULL,
    p_namespace     text DEFAULT NULL,
    p_topic         text DEFAULT NULL,
    p_error_code    text DEFAULT NULL,
    p_failed_after  timestamptz DEFAULT NULL,
    p_failed_before timestamptz DEFAULT NULL,
    p_max_rows      int DEFAULT 100,
    p_dry_run       boolean DEFAULT true,
    p_operator      text DEFAULT NULL,
    p_reason        text DEFAULT NULL)
RETURNS TABLE(message_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
-- Moves the matching dead letters (oldest first) back to pending with the
-- same id and sequence id, attempt count 0, due now, and archives a
-- REPLAYED attempt naming the operator given, the database login and the
-- reason. An ordered message takes its place in its key's line: a parked
-- key's dead head goes first and the key continues after it; a message whose
-- key moved on without it (on_dead = skip) goes as the key's next message,
-- and its REPLAYED attempt says so.
#variable_conflict use_column
DECLARE
    v_matched uuid[];
    v_key_ns  text[];
    v_key_ok  text[];
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 10000 THEN
        RAISE EXCEPTION 'outbox.replay_dead: p_max_rows must be between 1 and 10000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;

    v_matched := ARRAY(
        SELECT d.id
        FROM outbox.dead d
        WHERE (p_message_ids IS NULL OR d.id = ANY (p_message_ids))
          AND (p_namespace IS NULL OR d.namespace = p_namespace)
          AND (p_topic IS NULL OR d.topic = p_topic)
          AND (p_error_code IS NULL OR d.last_error_code = p_error_code)
          AND (p_failed_after IS NULL OR d.failed_at >= p_failed_after)
          AND (p_failed_before IS NULL OR d.failed_at < p_failed_before)
        ORDER BY d.failed_at, d.id
        LIMIT p_max_rows);

    IF coalesce(p_dry_run, true) THEN
        RETURN QUERY SELECT u.id FROM unnest(v_matched) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord;
        RETURN;
    END IF;

    -- The keys' locks first, as everyone who waits for them does: no
    -- dispatcher holding one of them can then be waiting for these rows.
    SELECT array_agg(d.namespace), array_agg(d.ordering_key) INTO v_key_ns, v_key_ok
    FROM outbox.dead d WHERE d.id = ANY (v_matched) AND d.ordering_key IS NOT NULL;
    PERFORM outbox.lock_keys(v_key_ns, v_key_ok);

    WITH picked AS (
        -- A concurrent replay of the same rows moves each of them once.
        SELECT d.id FROM outbox.dead d WHERE d.id = ANY (v_matched) FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        DELETE FROM outbox.dead d USING picked WHERE d.id = picked.id RETURNING d.*
    ),
    requeued AS (
        INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                    payload, payload_bytes, headers, trace_header, attempt_count, available_at,
                                    next_attempt_at, created_at, last_error_code, last_error, behind, park_on_dead)
        SELECT m.id, m.namespace, m.topic, m.tenant_id, m.dedupe_key, m.ordering_key, m.sequence_id,
               m.payload, m.payload_bytes, m.headers, m.trace_header, 0, now(), now(), m.created_at,
               m.last_error_code, m.last_error, m.ordering_key IS NOT NULL, m.holds_key
        FROM moved m
    ),
    audited AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic, tenant_id, dedupe_key,
                                     ordering_key, sequence_id, error_code, error_message, operator, reason,
                                     db_user, note)
        SELECT m.id, m.attempt_count, 'REPLAYED', m.namespace, m.topic, m.tenant_id, m.dedupe_key,
               m.ordering_key, m.sequence_id, m.last_error_code, m.last_error,
               coalesce(p_operator, session_user), p_reason, session_user,
               CASE WHEN m.ordering_key IS NOT NULL AND NOT m.holds_key AND s.last_sequence_id > m.sequence_id THEN
                   format('out of sequence: key %s had moved on to sequence %s without it (on_dead skip); delivered as the key''s next message',
                          m.ordering_key, s.last_sequence_id)
               END
        FROM moved m
        LEFT JOIN outbox.sequences s ON s.namespace = m.namespace AND s.ordering_key = m.ordering_key
    )
    SELECT array_agg(m.namespace) FILTER (WHERE m.ordering_key IS NOT NULL),
           array_agg(m.ordering_key) FILTER (WHERE m.ordering_key IS NOT NULL),
           array_agg(m.id ORDER BY m.failed_at, m.id)
      INTO v_key_ns, v_key_ok, v_matched
      FROM moved m;

    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, true);
    END IF;
    RETURN QUERY SELECT u.id FROM unnest(v_matched) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord;
END;
$$;
-- +goose StatementEnd

-- Heads that keep failing, for blocked_keys() and stats().
CREATE INDEX pending_failing_heads ON outbox.pending (failing_since)
    WHERE ordering_key IS NOT NULL AND NOT behind AND failing_since IS NOT NULL;
-- A key's dead letters, for replay's notes and the key retention purge.
CREATE INDEX dead_key ON outbox.dead (namespace, ordering_key, sequence_id) WHERE ordering_key IS NOT NULL;
-- Idle keys, oldest first, for the key retention purge.
CREATE INDEX sequences_updated_at ON outbox.sequences (updated_at);

-- +goose StatementBegin
CREATE FUNCTION outbox.discard(
    p_message_ids uuid[],
    p_reason      text,
    p_operator    text DEFAULT NULL)
RETURNS TABLE(message_id uuid, discarded_from text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- The named messages, by primary key: see claim_batch.
SET jit = off
AS $$
-- An operator gives up on messages for good: dead letters, and pending
-- messages no dispatcher holds (unleased, or their lease expired). Each gets
-- a DISCARDED attempt naming the operator given, the database login and the
-- reason; a parked key whose dead head is discarded continues with its next
-- message. A message leased right now is left alone (not returned): try
-- again when its delivery attempt is over.
#variable_conflict use_column
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_out    uuid[];
    v_from   text[];
    v_key_ns text[];
    v_key_ok text[];
BEGIN
    IF p_reason IS NULL OR btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'outbox.discard: a reason is required; it is kept in the attempts archive' USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_message_ids), 0) = 0 OR cardinality(p_message_ids) > 10000 THEN
        RAISE EXCEPTION 'outbox.discard: name 1 to 10000 messages, got %', coalesce(cardinality(p_message_ids), 0)
            USING ERRCODE = '22023';
    END IF;

    -- The keys' locks first, as everyone who waits for them does.
    SELECT array_agg(x.namespace), array_agg(x.ordering_key) INTO v_key_ns, v_key_ok
    FROM (SELECT d.namespace, d.ordering_key FROM outbox.dead d WHERE d.id = ANY (p_message_ids) AND d.ordering_key IS NOT NULL
          UNION
          SELECT p.namespace, p.ordering_key FROM outbox.pending p WHERE p.id = ANY (p_message_ids) AND p.ordering_key IS NOT NULL) x;
    PERFORM outbox.lock_keys(v_key_ns, v_key_ok);

    WITH from_dead AS (
        DELETE FROM outbox.dead d WHERE d.id = ANY (p_message_ids)
        RETURNING d.id, d.namespace, d.topic, d.tenant_id, d.dedupe_key, d.ordering_key, d.sequence_id,
                  d.attempt_count, d.last_error_code, d.last_error, 'dead' AS origin
    ),
    from_pending AS (
        DELETE FROM outbox.pending p
        WHERE p.id = ANY (p_message_ids) AND (p.lease_token IS NULL OR p.lease_expires_at <= v_now)
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  p.attempt_count, p.last_error_code, p.last_error, 'pending' AS origin
    ),
    gone AS (
        SELECT * FROM from_dead UNION ALL SELECT * FROM from_pending
    ),
    audited AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic, tenant_id, dedupe_key,
                                     ordering_key, sequence_id, error_code, error_message, operator, reason, db_user)
        SELECT g.id, g.attempt_count, 'DISCARDED', g.namespace, g.topic, g.tenant_id, g.dedupe_key,
               g.ordering_key, g.sequence_id, g.last_error_code, g.last_error,
               coalesce(p_operator, session_user), p_reason, session_user
        FROM gone g
    )
    SELECT array_agg(g.id ORDER BY g.id), array_agg(g.origin ORDER BY g.id),
           array_agg(g.namespace) FILTER (WHERE g.ordering_key IS NOT NULL),
           array_agg(g.ordering_key) FILTER (WHERE g.ordering_key IS NOT NULL)
      INTO v_out, v_from, v_key_ns, v_key_ok
      FROM gone g;

    IF v_key_ok IS NOT NULL THEN
        PERFORM outbox.settle_keys(v_key_ns, v_key_ok, true);
    END IF;
    RETURN QUERY SELECT u.id, u.origin FROM unnest(v_out, v_from) AS u(id, origin);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- blocked_key_states is the one definition of a blocked key, which
-- blocked_keys() lists and stats() counts: one row per ordering key that
-- cannot move, with why, since when, and the message it waits on.
--   parked         its head died under on_dead = park and holds it (since
--                  it died; the dead message);
--   lease_expired  its head is leased past its expiry: its dispatcher died
--                  or stalled (since the expiry);
--   retrying       its head keeps failing (since its first failure);
--   unsettled      it has messages but no head: a dispatcher could not
--                  settle it while a producer held its lock, and the next
--                  claim has not yet (since the debt; the message next in
--                  line). A debt on a key that has a head, or nothing
--                  pending, blocks nothing.
-- A key in more than one of these is reported once, in the first that
-- applies. Not executable by any runtime role; blocked_keys() and stats()
-- call it as its owner.
CREATE FUNCTION outbox.blocked_key_states(p_namespace text)
RETURNS TABLE(namespace text, ordering_key text, state text, since timestamptz, message_id uuid,
              sequence_id bigint, topic text, attempt_count int, error_code text, error text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT ON (b.namespace, b.ordering_key)
           b.namespace, b.ordering_key, b.state, b.since, b.id, b.sequence_id, b.topic,
           b.attempt_count, b.last_error_code, b.last_error
    FROM (
        SELECT 1 AS rank, d.namespace, d.ordering_key, 'parked' AS state, d.failed_at AS since, d.id,
               d.sequence_id, d.topic, d.attempt_count, d.last_error_code, d.last_error
        FROM outbox.dead d
        WHERE d.holds_key AND (p_namespace IS NULL OR d.namespace = p_namespace)
        UNION ALL
        SELECT 2, p.namespace, p.ordering_key,
               CASE WHEN p.lease_token IS NOT NULL THEN 'lease_expired' ELSE 'retrying' END,
               CASE WHEN p.lease_token IS NOT NULL THEN p.lease_expires_at ELSE p.failing_since END,
               p.id, p.sequence_id, p.topic, p.attempt_count, p.last_error_code, p.last_error
        FROM outbox.pending p
        WHERE p.ordering_key IS NOT NULL AND NOT p.behind
          AND ((p.lease_token IS NULL AND p.failing_since IS NOT NULL)
               OR (p.lease_token IS NOT NULL AND p.lease_expires_at <= clock_timestamp()))
          AND (p_namespace IS NULL OR p.namespace = p_namespace)
        UNION ALL
        SELECT 3, u.namespace, u.ordering_key, 'unsettled', u.since, n.id, n.sequence_id, n.topic,
               n.attempt_count, n.last_error_code,
               'a producer was committing to the key when its head changed; the next claim settles it'
        FROM (SELECT x.namespace, x.ordering_key, min(x.since) AS since
              FROM outbox.unsettled_keys x
              WHERE p_namespace IS NULL OR x.namespace = p_namespace
              GROUP BY x.namespace, x.ordering_key) u
        CROSS JOIN LATERAL (SELECT q.id, q.sequence_id, q.topic, q.attempt_count, q.last_error_code
                            FROM outbox.pending q
                            WHERE q.namespace = u.namespace AND q.ordering_key = u.ordering_key
                            ORDER BY q.sequence_id
                            LIMIT 1) n
        WHERE NOT EXISTS (SELECT 1 FROM outbox.pending h
                          WHERE h.namespace = u.namespace AND h.ordering_key = u.ordering_key AND NOT h.behind)
    ) b
    ORDER BY b.namespace, b.ordering_key, b.rank
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.blocked_keys(
    p_namespace text DEFAULT NULL,
    p_limit     int DEFAULT 100)
RETURNS TABLE(namespace text, ordering_key text, state text, since timestamptz, message_id uuid,
              sequence_id bigint, topic text, attempt_count int, error_code text, error text, waiting bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Blocked keys (see blocked_key_states), longest blocked first. waiting
    -- counts the key's other pending messages: those queued behind the
    -- message it waits on.
    SELECT b.namespace, b.ordering_key, b.state, b.since, b.message_id, b.sequence_id, b.topic, b.attempt_count,
           b.error_code, b.error,
           (SELECT count(*) FROM outbox.pending w
            WHERE w.namespace = b.namespace AND w.ordering_key = b.ordering_key AND w.id IS DISTINCT FROM b.message_id)
    FROM outbox.blocked_key_states(p_namespace) b
    ORDER BY b.since, b.namespace, b.ordering_key
    LIMIT greatest(coalesce(p_limit, 100), 1)
$$;
-- +goose StatementEnd

DROP FUNCTION outbox.stats();
-- +goose StatementBegin
CREATE FUNCTION outbox.stats()
RETURNS TABLE(namespace text, topic text, pending bigint, due bigint, leased bigint,
              expired_leases bigint, oldest_pending_age_seconds double precision, dead bigint,
              blocked_keys bigint, oldest_blocked_key_age_seconds double precision)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH p AS (
        SELECT p.namespace, p.topic,
               count(*) AS pending,
               count(*) FILTER (WHERE p.lease_token IS NULL AND NOT p.behind AND p.next_attempt_at <= now()) AS due,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL) AS leased,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL AND p.lease_expires_at <= clock_timestamp()) AS expired_leases,
               -- Age since the message became available, so that messages
               -- scheduled for later do not read as stuck.
               extract(epoch FROM now() - min(p.available_at) FILTER (WHERE p.available_at <= now()))::double precision AS oldest
        FROM outbox.pending p
        GROUP BY p.namespace, p.topic
    ),
    d AS (
        SELECT d.namespace, d.topic, count(*) AS dead
        FROM outbox.dead d
        GROUP BY d.namespace, d.topic
    ),
    -- Blocked keys, as blocked_keys() lists them, count under the topic of
    -- the message each waits on.
    b AS (
        SELECT x.namespace, x.topic, count(*) AS blocked,
               extract(epoch FROM clock_timestamp() - min(x.since))::double precision AS oldest
        FROM outbox.blocked_key_states(NULL) x
        GROUP BY x.namespace, x.topic
    ),
    pairs AS (
        SELECT p.namespace, p.topic FROM p UNION SELECT d.namespace, d.topic FROM d
        UNION SELECT b.namespace, b.topic FROM b
    )
    SELECT k.namespace, k.topic,
           coalesce(p.pending, 0), coalesce(p.due, 0), coalesce(p.leased, 0),
           coalesce(p.expired_leases, 0), coalesce(greatest(p.oldest, 0), 0), coalesce(d.dead, 0),
           coalesce(b.blocked, 0), coalesce(greatest(b.oldest, 0), 0)
    FROM pairs k
    LEFT JOIN p ON p.namespace = k.namespace AND p.topic = k.topic
    LEFT JOIN d ON d.namespace = k.namespace AND d.topic = k.topic
    LEFT JOIN b ON b.namespace = k.namespace AND b.topic = k.topic
    ORDER BY 1, 2
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- forget_attempts deletes the archived attempts p_ids, for retention. The
-- time of a terminal outcome (DISPATCHED, DISCARDED) whose message still has
-- its dedupe key moves into the key first (dedupe.settled_at): the key's
-- window counts from it. Every deletion from the archive goes through here.
-- Not executable by any runtime role; purge and purge_audit call it, under
-- their lock (one retention pass at a time).
CREATE FUNCTION outbox.forget_attempts(p_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    v_n bigint;
BEGIN
    -- Each key is found by its primary key and updated by its ctid, so a
    -- batch costs its own rows, never a scan of the dedupe table (which a
    -- hash join would choose for a batch of thousands).
    WITH outcomes AS (
        SELECT a.namespace, a.topic, a.dedupe_key, a.message_id, max(a.created_at) AS at
        FROM outbox.attempts a
        WHERE a.id = ANY (p_ids) AND a.state IN ('DISPATCHED', 'DISCARDED') AND a.dedupe_key IS NOT NULL
        GROUP BY a.namespace, a.topic, a.dedupe_key, a.message_id
    ),
    kept AS (
        SELECT k.tid, o.at FROM outcomes o
        CROSS JOIN LATERAL (
            SELECT k.ctid AS tid FROM outbox.dedupe k
            WHERE k.namespace = o.namespace AND k.topic = o.topic AND k.dedupe_key = o.dedupe_key
              AND k.message_id = o.message_id
            OFFSET 0) k
    )
    UPDATE outbox.dedupe k SET settled_at = greatest(k.settled_at, t.at)
    FROM kept t
    WHERE k.ctid = t.tid;

    PERFORM set_config('outbox.purge_in_progress', 'on', true);
    DELETE FROM outbox.attempts a WHERE a.id = ANY (p_ids);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM set_config('outbox.purge_in_progress', 'off', true);
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

DROP FUNCTION outbox.purge(interval, interval, int);
-- +goose StatementBegin
CREATE FUNCTION outbox.purge(
    p_attempts_older_than interval,
    p_dedupe_older_than   interval,
    p_max_rows            int,
    p_keys_older_than     interval DEFAULT NULL)
RETURNS TABLE(purged_attempts bigint, purged_dedupe bigint, purged_keys bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
-- A batch's per-row probes make its plans' costs look huge; compiling them
-- (350 ms for the dedupe purge of 10,000 rows) costs more than running them.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_attempts bigint := 0;
    v_dedupe   bigint := 0;
    v_keys     bigint := 0;
    v_floor    bigint;
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    -- The archive is the audit trail, and a dedupe key the only guard
    -- against a producer's retry enqueueing twice: whoever calls this may
    -- not shorten them below an hour, as the reaper's own settings may not.
    IF p_attempts_older_than < interval '1 hour' OR p_dedupe_older_than < interval '1 hour'
       OR p_keys_older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'outbox.purge: retention must be at least 1 hour (or NULL to keep), got attempts %, dedupe %, keys %',
            p_attempts_older_than, p_dedupe_older_than, p_keys_older_than USING ERRCODE = '22023';
    END IF;
    -- One retention pass at a time (purge_audit included): a pass locks the
    -- dedupe keys whose outcomes it moves before the archive rows it
    -- deletes, then the keys it deletes, and two passes of different
    -- retentions would take them in orders that can deadlock.
    PERFORM pg_advisory_xact_lock(hashtext('outbox'), hashtext('purge'));

    -- A NULL interval leaves that table alone. The history of a message
    -- that is still pending or dead is kept whatever its age: it is what an
    -- operator reads when deciding what to do with it. Operators' own
    -- actions (REPLAYED, DISCARDED) are not the dispatcher's to erase: only
    -- outbox.purge_audit, an operator's, deletes them. A delivery's time
    -- survives its row in the key it still guards (see forget_attempts).
    --
    -- A batch costs the rows it reads: each check is a primary key probe
    -- (OFFSET 0 keeps the planner from hashing all of pending or dead for
    -- an anti-join), and the keys are deleted by their ctids.
    IF p_attempts_older_than IS NOT NULL THEN
        v_attempts := outbox.forget_attempts(ARRAY(
            SELECT o.id FROM outbox.attempts o
            WHERE o.created_at < now() - p_attempts_older_than
              AND o.state NOT IN ('REPLAYED', 'DISCARDED')
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
            LIMIT p_max_rows));
    END IF;

    -- A dedupe key outlives its message by the retention window, counted
    -- from the message's terminal outcome (delivered or discarded), never
    -- from its enqueue: a message that waited longer than the window (its
    -- retries, AvailableAt, an outage) keeps its key for the whole window
    -- after it went. While the message is pending or dead, its key stays,
    -- and so does a key whose outcome is known nowhere (the archive has no
    -- terminal row and the key no settled_at: only a hand edit does that).
    -- The key's own age is a cheap first filter, since no message goes
    -- before it is enqueued.
    IF p_dedupe_older_than IS NOT NULL THEN
        DELETE FROM outbox.dedupe x
        WHERE x.ctid = ANY (ARRAY(
            SELECT k.ctid FROM outbox.dedupe k
            WHERE k.created_at < now() - p_dedupe_older_than
              -- The latest outcome known, in the key or in the archive
              -- (greatest ignores a NULL; two NULLs keep the key).
              AND greatest(k.settled_at,
                           (SELECT max(a.created_at) FROM outbox.attempts a
                            WHERE a.message_id = k.message_id AND a.state IN ('DISPATCHED', 'DISCARDED')))
                  < now() - p_dedupe_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = k.message_id OFFSET 0)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = k.message_id OFFSET 0)
            LIMIT p_max_rows));
        GET DIAGNOSTICS v_dedupe = ROW_COUNT;
    END IF;

    -- A key with nothing pending or dead, idle for the retention window,
    -- loses its bookkeeping (sequence allocator and key row). Its sequence
    -- ids must never go back if it comes back, so a key is forgotten only
    -- once outbox.sequence_floor (which new keys start above) covers it, and
    -- the floor is raised in an earlier pass than the one that forgets: a
    -- producer that read the old floor has committed or failed by then.
    IF p_keys_older_than IS NOT NULL THEN
        SELECT f.last_sequence_id INTO v_floor FROM outbox.sequence_floor f;
        WITH idle AS (
            SELECT s.namespace, s.ordering_key, s.last_sequence_id
            FROM outbox.sequences s
            WHERE s.updated_at < now() - p_keys_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p
                              WHERE p.namespace = s.namespace AND p.ordering_key = s.ordering_key)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d
                              WHERE d.namespace = s.namespace AND d.ordering_key = s.ordering_key)
              AND NOT EXISTS (SELECT 1 FROM outbox.unsettled_keys u
                              WHERE u.namespace = s.namespace AND u.ordering_key = s.ordering_key)
            ORDER BY s.updated_at
            LIMIT p_max_rows
            -- A producer enqueueing to the key right now holds its row.
            FOR UPDATE OF s SKIP LOCKED
        ),
        -- And whoever is settling it right now holds its key row.
        unlocked AS (
            SELECT k.namespace, k.ordering_key FROM outbox.keys k JOIN idle i USING (namespace, ordering_key)
            FOR UPDATE OF k SKIP LOCKED
        ),
        forgotten AS (
            DELETE FROM outbox.sequences s
            USING idle i
            WHERE s.namespace = i.namespace AND s.ordering_key = i.ordering_key AND i.last_sequence_id <= v_floor
              AND (EXISTS (SELECT 1 FROM unlocked u WHERE u.namespace = i.namespace AND u.ordering_key = i.ordering_key)
                   OR NOT EXISTS (SELECT 1 FROM outbox.keys k WHERE k.namespace = i.namespace AND k.ordering_key = i.ordering_key))
            RETURNING s.namespace, s.ordering_key
        ),
        unkeyed AS (
            DELETE FROM outbox.keys k USING forgotten f
            WHERE k.namespace = f.namespace AND k.ordering_key = f.ordering_key
        ),
        raised AS (
            UPDATE outbox.sequence_floor f
            SET last_sequence_id = (SELECT max(i.last_sequence_id) FROM idle i)
            WHERE (SELECT max(i.last_sequence_id) FROM idle i) > f.last_sequence_id
        )
        SELECT count(*) INTO v_keys FROM forgotten;
    END IF;

    RETURN QUERY SELECT v_attempts, v_dedupe, v_keys;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.purge_audit(
    p_older_than interval,
    p_max_rows   int,
    p_operator   text DEFAULT NULL,
    p_reason     text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
-- Operators' actions in the archive (REPLAYED, DISCARDED) older than
-- p_older_than, of messages no longer pending or dead: the audit trail,
-- which outbox.purge leaves alone and only an operator may shorten. The
-- purge itself is recorded in outbox.operator_log, which nothing shortens.
DECLARE
    v_n bigint;
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '1 day' THEN
        RAISE EXCEPTION 'outbox.purge_audit: the audit trail is kept at least 1 day, got %', p_older_than
            USING ERRCODE = '22023';
    END IF;
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge_audit: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    -- One retention pass at a time: see outbox.purge.
    PERFORM pg_advisory_xact_lock(hashtext('outbox'), hashtext('purge'));
    v_n := outbox.forget_attempts(ARRAY(
        SELECT o.id FROM outbox.attempts o
        WHERE o.created_at < now() - p_older_than
          AND o.state IN ('REPLAYED', 'DISCARDED')
          AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id OFFSET 0)
          AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id OFFSET 0)
        LIMIT p_max_rows));
    PERFORM outbox.record_operator_action('purge_audit', 'outbox.attempts', p_operator, p_reason,
        jsonb_build_object('older_than', p_older_than::text, 'max_rows', p_max_rows, 'purged', v_n));
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.grant_namespace(
    p_role      name,
    p_namespace text,
    p_operator  text DEFAULT NULL,
    p_reason    text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- Confines p_role's members to the namespaces granted to it (this one and
-- any others): from their next enqueue, any other namespace is refused.
-- Recorded in outbox.operator_log, a grant that already existed too.
DECLARE
    v_new boolean;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_role) THEN
        RAISE EXCEPTION 'outbox.grant_namespace: role % does not exist', quote_ident(p_role) USING ERRCODE = '22023';
    END IF;
    IF p_namespace IS NULL OR octet_length(p_namespace) > 128 OR p_namespace !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$' THEN
        RAISE EXCEPTION 'outbox.grant_namespace: % is not a namespace (1-128 characters of letters, digits and . _ : / -, starting with a letter or digit)',
            quote_literal(p_namespace) USING ERRCODE = '22023';
    END IF;
    INSERT INTO outbox.producer_namespaces (role_name, namespace) VALUES (p_role, p_namespace)
    ON CONFLICT ON CONSTRAINT producer_namespaces_pkey DO NOTHING;
    v_new := FOUND;
    PERFORM outbox.record_operator_action('grant_namespace', p_role, p_operator, p_reason,
        jsonb_build_object('namespace', p_namespace, 'new', v_new));
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox.revoke_namespace(
    p_role      name,
    p_namespace text,
    p_operator  text DEFAULT NULL,
    p_reason    text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- Takes a namespace back from p_role; a role left with none is no longer
-- confined at all. Returns whether the grant existed. The grant's row goes;
-- outbox.operator_log keeps who revoked it, and who had granted it when.
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
-- +goose StatementEnd

-- Every new function is the state machine's, not the public's.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON outbox.limits, outbox.sequence_floor, outbox.keys, outbox.unsettled_keys, outbox.producer_namespaces, outbox.operator_log FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    outbox.claim_batch(int, text, int, text[], int, bigint, int, int),
    outbox.claimable_estimate(int, text[]),
    outbox.complete_batch(text, jsonb, int, boolean, uuid[], uuid[], text[], text[], text[], text[], text[], int[],
                          timestamptz[], text[], boolean[]),
    outbox.purge(interval, interval, int, interval),
    outbox.stats(),
    outbox.blocked_keys(text, int)
TO outbox_dispatcher;
GRANT EXECUTE ON FUNCTION
    outbox.discard(uuid[], text, text),
    outbox.purge_audit(interval, int, text, text),
    outbox.grant_namespace(name, text, text, text),
    outbox.revoke_namespace(name, text, text, text),
    outbox.stats(),
    outbox.blocked_keys(text, int)
TO outbox_operator;
GRANT EXECUTE ON FUNCTION outbox.stats(), outbox.blocked_keys(text, int) TO outbox_reader;
GRANT SELECT ON outbox.limits, outbox.producer_namespaces, outbox.operator_log TO outbox_operator, outbox_reader;

-- +goose Down
-- Back to migration 4: the previous state machine, verbatim from migration 2
-- (a rollback must restore exactly what ran before), and the tables as they
-- were. Ordering keys become global again; if two namespaces now hold the
-- same sequence id of one key, the rollback stops with an error instead of
-- losing the order.
DROP TRIGGER sequences_settle_at_commit ON outbox.sequences;
DROP FUNCTION outbox.sequences_settle_at_commit();
DROP FUNCTION outbox.discard(uuid[], text, text);
DROP FUNCTION outbox.grant_namespace(name, text, text, text);
DROP FUNCTION outbox.revoke_namespace(name, text, text, text);
DROP FUNCTION outbox.purge_audit(interval, int, text, text);
DROP FUNCTION outbox.forget_attempts(bigint[]);
DROP FUNCTION outbox.record_operator_action(text, text, text, text, jsonb);
DROP TABLE outbox.operator_log;
DROP FUNCTION outbox.operator_log_append_only();
DROP FUNCTION outbox.blocked_keys(text, int);
DROP FUNCTION outbox.blocked_key_states(text);
DROP FUNCTION outbox.claim_batch(int, text, int, text[], int, bigint, int, int);
DROP FUNCTION outbox.claimable_estimate(int, text[]);
DROP FUNCTION outbox.requeue_expired_leases(int, text, int, timestamptz, text[]);
DROP FUNCTION outbox.complete_batch(text, jsonb, int, boolean, uuid[], uuid[], text[], text[], text[], text[], text[], int[],
                                    timestamptz[], text[], boolean[]);
DROP FUNCTION outbox.stats();
DROP FUNCTION outbox.purge(interval, interval, int, interval);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.enqueue(
    p_namespace    text,
    p_topic        text,
    p_payload      jsonb,
    p_tenant_id    text DEFAULT NULL,
    p_dedupe_key   text DEFAULT NULL,
    p_ordering_key text DEFAULT NULL,
    p_headers      jsonb DEFAULT '{}',
    p_trace_header text DEFAULT NULL,
    p_available_at timestamptz DEFAULT now())
RETURNS TABLE(message_id uuid, sequence_id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id        uuid := outbox.uuid_v7();
    v_seq       bigint;
    v_available timestamptz := greatest(coalesce(p_available_at, now()), now());
BEGIN
    IF p_dedupe_key IS NOT NULL THEN
        -- Claim the key first: on a conflict nothing at all is written.
        -- A concurrent enqueue of the same key waits here for the other
        -- transaction and then sees its row (READ COMMITTED).
        INSERT INTO outbox.dedupe (namespace, topic, dedupe_key, message_id)
        VALUES (p_namespace, p_topic, p_dedupe_key, v_id)
        ON CONFLICT ON CONSTRAINT dedupe_pkey DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY
                SELECT d.message_id, d.sequence_id, false
                FROM outbox.dedupe d
                WHERE d.namespace = p_namespace AND d.topic = p_topic AND d.dedupe_key = p_dedupe_key;
            RETURN;
        END IF;
    END IF;

    IF p_ordering_key IS NOT NULL THEN
        -- The row lock on the key's sequence serialises its producers until
        -- commit, so sequence order is also commit order.
        INSERT INTO outbox.sequences AS s (ordering_key, last_sequence_id)
        VALUES (p_ordering_key, 1)
        ON CONFLICT ON CONSTRAINT sequences_pkey
            DO UPDATE SET last_sequence_id = s.last_sequence_id + 1, updated_at = now()
        RETURNING s.last_sequence_id INTO v_seq;
        IF p_dedupe_key IS NOT NULL THEN
            UPDATE outbox.dedupe d SET sequence_id = v_seq
            WHERE d.namespace = p_namespace AND d.topic = p_topic AND d.dedupe_key = p_dedupe_key;
        END IF;
    END IF;

    INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                payload, headers, trace_header, available_at, next_attempt_at)
    VALUES (v_id, p_namespace, p_topic, p_tenant_id, p_dedupe_key, p_ordering_key, v_seq,
            p_payload, coalesce(p_headers, '{}'::jsonb), p_trace_header, v_available, v_available);

    RETURN QUERY SELECT v_id, v_seq, true;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.enqueue_batch(
    p_namespaces    text[],
    p_topics        text[],
    p_payloads      text[],
    p_tenant_ids    text[] DEFAULT NULL,
    p_dedupe_keys   text[] DEFAULT NULL,
    p_ordering_keys text[] DEFAULT NULL,
    p_headers       text[] DEFAULT NULL,
    p_trace_headers text[] DEFAULT NULL,
    p_available_at  timestamptz[] DEFAULT NULL)
RETURNS TABLE(message_id uuid, sequence_id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- A generic plan made while the tables were small would keep scanning
-- dedupe in full as it grows; plan each statement for the data at hand.
SET plan_cache_mode = force_custom_plan
AS $$
-- The set-based form of enqueue() for many messages at once: the same
-- results, in input order, for a fraction of the per-row cost. Element i of
-- every array describes message i; optional arrays may be NULL. Within one
-- batch the first message with a dedupe key wins it and later ones are
-- dedupe hits, exactly as with enqueue() called in order. Keys are locked in
-- sorted order, so concurrent batches sharing keys cannot deadlock.
#variable_conflict use_column
DECLARE
    v_n        int := coalesce(cardinality(p_namespaces), 0);
    v_now      timestamptz := now();
    v_ids      uuid[];
    v_inserted boolean[];
    v_seqs     bigint[];
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_topics), 0) <> v_n OR coalesce(cardinality(p_payloads), 0) <> v_n
       OR coalesce(cardinality(p_tenant_ids), v_n) <> v_n OR coalesce(cardinality(p_dedupe_keys), v_n) <> v_n
       OR coalesce(cardinality(p_ordering_keys), v_n) <> v_n OR coalesce(cardinality(p_headers), v_n) <> v_n
       OR coalesce(cardinality(p_trace_headers), v_n) <> v_n OR coalesce(cardinality(p_available_at), v_n) <> v_n THEN
        RAISE EXCEPTION 'outbox.enqueue_batch: every array must have one element per message (% messages)', v_n
            USING ERRCODE = '22023';
    END IF;

    v_ids := ARRAY(SELECT outbox.uuid_v7() FROM generate_series(1, v_n));

    -- 1. Claim the dedupe keys, in key order; the lowest position wins a key
    --    repeated within the batch.
    IF p_dedupe_keys IS NOT NULL THEN
        INSERT INTO outbox.dedupe (namespace, topic, dedupe_key, message_id)
        SELECT e.ns, e.tp, e.dk, e.id
        FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_ids) WITH ORDINALITY AS e(ns, tp, dk, id, ord)
        WHERE e.dk IS NOT NULL
        ORDER BY e.ns, e.tp, e.dk, e.ord
        ON CONFLICT ON CONSTRAINT dedupe_pkey DO NOTHING;

        -- A new statement, so a new snapshot: keys that a concurrent
        -- transaction committed while we waited on them are visible here.
        v_inserted := ARRAY(
            SELECT d.message_id IS NULL OR d.message_id = e.id
            FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_ids) WITH ORDINALITY AS e(ns, tp, dk, id, ord)
            LEFT JOIN LATERAL (
                -- OFFSET 0 keeps this a per-message primary key probe: a
                -- hash join over the whole table is what stale statistics
                -- would choose on a table that grows by the batch.
                SELECT k.message_id FROM outbox.dedupe k
                WHERE k.namespace = e.ns AND k.topic = e.tp AND k.dedupe_key = e.dk OFFSET 0) d ON true
            ORDER BY e.ord);
    ELSE
        v_inserted := array_fill(true, ARRAY[v_n]);
    END IF;

    -- 2. Sequence ids for the inserted messages with an ordering key: each
    --    key's allocator moves once by its count, in key order.
    IF p_ordering_keys IS NOT NULL THEN
        WITH e AS (
            SELECT x.ok, x.ord, row_number() OVER (PARTITION BY x.ok ORDER BY x.ord) AS rank
            FROM unnest(p_ordering_keys, v_inserted) WITH ORDINALITY AS x(ok, ins, ord)
            WHERE x.ok IS NOT NULL AND x.ins
        ),
        counts AS (
            SELECT e.ok, count(*) AS n FROM e GROUP BY e.ok
        ),
        bumped AS (
            INSERT INTO outbox.sequences AS s (ordering_key, last_sequence_id)
            SELECT c.ok, c.n FROM counts c ORDER BY c.ok
            ON CONFLICT ON CONSTRAINT sequences_pkey
                DO UPDATE SET last_sequence_id = s.last_sequence_id + excluded.last_sequence_id, updated_at = now()
            RETURNING s.ordering_key, s.last_sequence_id
        )
        SELECT array_agg(CASE WHEN e.ok IS NULL THEN NULL ELSE b.last_sequence_id - c.n + e.rank END ORDER BY g.ord)
        INTO v_seqs
        FROM generate_series(1, v_n) AS g(ord)
        LEFT JOIN e ON e.ord = g.ord
        LEFT JOIN counts c ON c.ok = e.ok
        LEFT JOIN bumped b ON b.ordering_key = e.ok;

        IF p_dedupe_keys IS NOT NULL THEN
            UPDATE outbox.dedupe d SET sequence_id = x.seq
            FROM unnest(p_namespaces, p_topics, p_dedupe_keys, v_seqs, v_inserted) AS x(ns, tp, dk, seq, ins)
            WHERE x.ins AND x.dk IS NOT NULL AND x.seq IS NOT NULL
              AND (d.namespace, d.topic, d.dedupe_key) = (x.ns, x.tp, x.dk);
        END IF;
    END IF;

    -- 3. The messages themselves.
    INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                payload, headers, trace_header, available_at, next_attempt_at)
    SELECT x.id, x.ns, x.tp, x.tenant, x.dk, x.ok, x.seq, x.payload::jsonb, coalesce(x.headers::jsonb, '{}'::jsonb),
           x.trace, greatest(coalesce(x.at, v_now), v_now), greatest(coalesce(x.at, v_now), v_now)
    FROM unnest(v_ids, p_namespaces, p_topics, p_tenant_ids, p_dedupe_keys, p_ordering_keys, v_seqs,
                p_payloads, p_headers, p_trace_headers, p_available_at, v_inserted)
         AS x(id, ns, tp, tenant, dk, ok, seq, payload, headers, trace, at, ins)
    WHERE x.ins;

    -- 4. One row per message, in order; a dedupe hit answers with the
    --    message that holds the key.
    RETURN QUERY
    SELECT CASE WHEN x.ins THEN x.id ELSE d.message_id END,
           CASE WHEN x.ins THEN x.seq ELSE d.sequence_id END,
           x.ins
    FROM unnest(v_ids, p_namespaces, p_topics, p_dedupe_keys, v_seqs, v_inserted) WITH ORDINALITY
         AS x(id, ns, tp, dk, seq, ins, ord)
    LEFT JOIN LATERAL (
        SELECT k.message_id, k.sequence_id FROM outbox.dedupe k
        WHERE NOT x.ins AND k.namespace = x.ns AND k.topic = x.tp AND k.dedupe_key = x.dk OFFSET 0) d ON true
    ORDER BY x.ord;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION outbox.claim_batch(
    p_batch_size    int,
    p_worker_id     text,
    p_lease_seconds int,
    p_namespaces    text[] DEFAULT NULL)
RETURNS TABLE(id uuid, namespace text, topic text, tenant_id text, dedupe_key text,
              ordering_key text, sequence_id bigint, payload jsonb, headers jsonb,
              trace_header text, attempt_count int, lease_token uuid,
              lease_expires_at timestamptz, created_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- A generic plan cannot see the LIMIT and falls back to a sequential scan
-- and sort; a custom plan walks pending_claimable in order and stops.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 10000 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_batch_size must be between 1 and 10000, got %', p_batch_size
            USING ERRCODE = '22023';
    END IF;
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_worker_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF p_lease_seconds IS NULL OR p_lease_seconds < 1 THEN
        RAISE EXCEPTION 'outbox.claim_batch: p_lease_seconds must be at least 1, got %', p_lease_seconds
            USING ERRCODE = '22023';
    END IF;

    RETURN QUERY
    WITH candidate AS (
        SELECT p.id
        FROM outbox.pending p
        WHERE p.lease_token IS NULL
          AND p.next_attempt_at <= now()
          AND (p_namespaces IS NULL OR p.namespace = ANY (p_namespaces))
          -- Only the head of an ordering key (its lowest sequence_id still
          -- pending, leased or not) may be claimed.
          AND (p.ordering_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM outbox.pending head
                WHERE head.ordering_key = p.ordering_key
                  AND head.sequence_id < p.sequence_id))
        ORDER BY p.next_attempt_at, p.id
        LIMIT p_batch_size
        FOR UPDATE OF p SKIP LOCKED
    )
    UPDATE outbox.pending p
    SET claimed_by       = p_worker_id,
        lease_token      = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        attempt_count    = p.attempt_count + 1
    FROM candidate c
    WHERE p.id = c.id
    RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
              p.payload, p.headers, p.trace_header, p.attempt_count, p.lease_token,
              p.lease_expires_at, p.created_at;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.complete_batch(
    p_worker_id    text,
    p_results      jsonb,
    p_max_attempts int DEFAULT 100)
RETURNS TABLE(id uuid, status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_total    int;
    v_distinct int;
    v_invalid  int;
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_worker_id must not be empty' USING ERRCODE = 'P7003';
    END IF;
    IF jsonb_typeof(p_results) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_results must be a JSON array of results' USING ERRCODE = 'P7003';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox.complete_batch: p_max_attempts must be at least 1' USING ERRCODE = '22023';
    END IF;

    -- Validate the whole document before writing anything: a malformed
    -- completion is a bug in the caller and must not half-apply. This block
    -- only reads, so its subtransaction never takes a transaction id.
    BEGIN
        SELECT count(*),
               count(DISTINCT r.id),
               count(*) FILTER (WHERE r.id IS NULL OR r.lease_token IS NULL OR r.outcome IS NULL
                                   OR r.outcome NOT IN ('DISPATCHED', 'RETRYABLE', 'FAILED'))
          INTO v_total, v_distinct, v_invalid
          FROM jsonb_to_recordset(p_results) AS r(id uuid, lease_token uuid, outcome text,
                                                  latency_ms int, retry_at timestamptz);
    EXCEPTION WHEN invalid_text_representation OR invalid_parameter_value OR datatype_mismatch
                OR invalid_datetime_format OR datetime_field_overflow OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'outbox.complete_batch: malformed result document: %', SQLERRM USING ERRCODE = 'P7003';
    END;
    IF v_invalid > 0 THEN
        RAISE EXCEPTION 'outbox.complete_batch: % result(s) without id, lease_token or a valid outcome (DISPATCHED, RETRYABLE, FAILED)', v_invalid
            USING ERRCODE = 'P7003';
    END IF;
    IF v_distinct <> v_total THEN
        RAISE EXCEPTION 'outbox.complete_batch: a message id appears more than once in one batch' USING ERRCODE = 'P7003';
    END IF;

    -- The DELETE and the UPDATE are the fence: each touches only rows still
    -- leased to this worker under the result's token and not yet expired.
    -- A row that a reaper or another worker changed meanwhile fails the
    -- re-check PostgreSQL makes after waiting for its lock, and is left
    -- alone; it reports lease_lost.
    RETURN QUERY
    WITH r AS (
        SELECT *
        FROM ROWS FROM (jsonb_to_recordset(p_results) AS (
                 id uuid, lease_token uuid, outcome text, error_code text, error_message text,
                 target text, target_ref text, latency_ms int, retry_at timestamptz))
             WITH ORDINALITY AS r(id, lease_token, outcome, error_code, error_message,
                                  target, target_ref, latency_ms, retry_at, ord)
    ),
    -- DISPATCHED and FAILED leave pending; so does a RETRYABLE outcome at
    -- the attempt ceiling, which becomes FAILED.
    removed AS (
        DELETE FROM outbox.pending p
        USING r
        WHERE p.id = r.id
          AND p.lease_token = r.lease_token
          AND p.claimed_by = p_worker_id
          AND p.lease_expires_at > now()
          AND (r.outcome <> 'RETRYABLE' OR p.attempt_count >= p_max_attempts)
        -- A delivered row's payload is not needed past this point: carrying
        -- it through the CTEs costs more than the delete itself.
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.payload END AS payload,
                  CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.headers END AS headers,
                  p.trace_header, p.attempt_count, p.available_at, p.created_at,
                  r.outcome AS requested,
                  CASE WHEN r.outcome = 'DISPATCHED' THEN 'DISPATCHED' ELSE 'FAILED' END AS outcome,
                  r.error_code, left(r.error_message, 4096) AS error_message, r.target, r.target_ref, r.latency_ms
    ),
    rescheduled AS (
        UPDATE outbox.pending p
        SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_attempt_at = greatest(coalesce(r.retry_at, now()), now()),
            last_error_code = r.error_code,
            last_error = left(r.error_message, 4096)
        FROM r
        WHERE p.id = r.id
          AND p.lease_token = r.lease_token
          AND p.claimed_by = p_worker_id
          AND p.lease_expires_at > now()
          AND r.outcome = 'RETRYABLE' AND p.attempt_count < p_max_attempts
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  p.attempt_count, r.error_code, left(r.error_message, 4096) AS error_message,
                  r.target, r.target_ref, r.latency_ms
    ),
    buried AS (
        INSERT INTO outbox.dead (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                 payload, headers, trace_header, attempt_count, available_at, created_at,
                                 last_error_code, last_error, failed_by)
        SELECT x.id, x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id,
               x.payload, x.headers, x.trace_header, x.attempt_count, x.available_at, x.created_at,
               x.error_code, x.error_message, p_worker_id
        FROM removed x
        WHERE x.outcome = 'FAILED'
    ),
    archived AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                     dedupe_key, ordering_key, sequence_id, target, target_ref,
                                     error_code, error_message, latency_ms)
        SELECT x.id, x.attempt_count, x.outcome, p_worker_id, x.namespace, x.topic, x.tenant_id,
               x.dedupe_key, x.ordering_key, x.sequence_id, x.target, x.target_ref,
               x.error_code, x.error_message, x.latency_ms
        FROM removed x
        UNION ALL
        SELECT q.id, q.attempt_count, 'RETRYABLE', p_worker_id, q.namespace, q.topic, q.tenant_id,
               q.dedupe_key, q.ordering_key, q.sequence_id, q.target, q.target_ref,
               q.error_code, q.error_message, q.latency_ms
        FROM rescheduled q
    ),
    done AS (
        SELECT x.id, CASE WHEN x.requested = 'RETRYABLE' THEN 'dead' ELSE 'ok' END AS status FROM removed x
        UNION ALL
        SELECT q.id, 'ok' FROM rescheduled q
    )
    SELECT r.id, coalesce(d.status, 'lease_lost')
    FROM r
    LEFT JOIN done d ON d.id = r.id
    ORDER BY r.ord;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.repair_expired_leases(
    p_batch_size   int,
    p_worker_id    text,
    p_max_attempts int DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_repaired integer;
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 100000 THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_batch_size must be between 1 and 100000, got %', p_batch_size
            USING ERRCODE = '22023';
    END IF;
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.repair_expired_leases: p_worker_id must not be empty' USING ERRCODE = '22023';
    END IF;

    WITH expired AS (
        SELECT p.id, p.claimed_by AS held_by
        FROM outbox.pending p
        WHERE p.lease_token IS NOT NULL
          AND p.lease_expires_at <= now()
        ORDER BY p.lease_expires_at
        LIMIT p_batch_size
        FOR UPDATE OF p SKIP LOCKED
    ),
    requeued AS (
        UPDATE outbox.pending p
        SET claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_attempt_at = now(),
            last_error_code = 'LEASE_EXPIRED',
            last_error = 'lease held by ' || e.held_by || ' expired before completion'
        FROM expired e
        WHERE p.id = e.id AND p.attempt_count < p_max_attempts
        RETURNING p.id, p.namespace, p.topic, p.tenant_id, p.dedupe_key, p.ordering_key, p.sequence_id,
                  p.attempt_count, e.held_by
    ),
    -- A message whose every attempt ends in a crash (it kills the
    -- dispatcher, or outlives the lease) must not loop for ever.
    removed AS (
        DELETE FROM outbox.pending p
        USING expired e
        WHERE p.id = e.id AND p.attempt_count >= p_max_attempts
        RETURNING p.*, e.held_by
    ),
    buried AS (
        INSERT INTO outbox.dead (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                 payload, headers, trace_header, attempt_count, available_at, created_at,
                                 last_error_code, last_error, failed_by)
        SELECT x.id, x.namespace, x.topic, x.tenant_id, x.dedupe_key, x.ordering_key, x.sequence_id,
               x.payload, x.headers, x.trace_header, x.attempt_count, x.available_at, x.created_at,
               'LEASE_EXPIRED',
               'lease held by ' || x.held_by || ' expired on attempt ' || x.attempt_count
                   || ', the attempt ceiling; moved to dead',
               p_worker_id
        FROM removed x
    ),
    archived AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, tenant_id,
                                     dedupe_key, ordering_key, sequence_id, error_code, error_message)
        SELECT q.id, q.attempt_count, 'ZOMBIE_REQUEUE', p_worker_id, q.namespace, q.topic, q.tenant_id,
               q.dedupe_key, q.ordering_key, q.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || q.held_by || ' expired before completion'
        FROM requeued q
        UNION ALL
        SELECT x.id, x.attempt_count, 'FAILED', p_worker_id, x.namespace, x.topic, x.tenant_id,
               x.dedupe_key, x.ordering_key, x.sequence_id, 'LEASE_EXPIRED',
               'lease held by ' || x.held_by || ' expired on attempt ' || x.attempt_count
                   || ', the attempt ceiling; moved to dead'
        FROM removed x
    )
    SELECT (SELECT count(*) FROM requeued) + (SELECT count(*) FROM removed) INTO v_repaired;
    RETURN v_repaired;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox.replay_dead(
    p_message_ids   uuid[] DEFAULT NULL,
    p_namespace     text DEFAULT NULL,
    p_topic         text DEFAULT NULL,
    p_error_code    text DEFAULT NULL,
    p_failed_after  timestamptz DEFAULT NULL,
    p_failed_before timestamptz DEFAULT NULL,
    p_max_rows      int DEFAULT 100,
    p_dry_run       boolean DEFAULT true,
    p_operator      text DEFAULT NULL,
    p_reason        text DEFAULT NULL)
RETURNS TABLE(message_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_matched uuid[];
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 10000 THEN
        RAISE EXCEPTION 'outbox.replay_dead: p_max_rows must be between 1 and 10000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;

    v_matched := ARRAY(
        SELECT d.id
        FROM outbox.dead d
        WHERE (p_message_ids IS NULL OR d.id = ANY (p_message_ids))
          AND (p_namespace IS NULL OR d.namespace = p_namespace)
          AND (p_topic IS NULL OR d.topic = p_topic)
          AND (p_error_code IS NULL OR d.last_error_code = p_error_code)
          AND (p_failed_after IS NULL OR d.failed_at >= p_failed_after)
          AND (p_failed_before IS NULL OR d.failed_at < p_failed_before)
        ORDER BY d.failed_at, d.id
        LIMIT p_max_rows);

    IF coalesce(p_dry_run, true) THEN
        RETURN QUERY SELECT u.id FROM unnest(v_matched) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord;
        RETURN;
    END IF;

    RETURN QUERY
    WITH picked AS (
        -- A concurrent replay of the same rows moves each of them once.
        SELECT d.id FROM outbox.dead d WHERE d.id = ANY (v_matched) FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        DELETE FROM outbox.dead d USING picked WHERE d.id = picked.id RETURNING d.*
    ),
    requeued AS (
        INSERT INTO outbox.pending (id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id,
                                    payload, headers, trace_header, attempt_count, available_at,
                                    next_attempt_at, created_at, last_error_code, last_error)
        SELECT m.id, m.namespace, m.topic, m.tenant_id, m.dedupe_key, m.ordering_key, m.sequence_id,
               m.payload, m.headers, m.trace_header, 0, now(), now(), m.created_at,
               m.last_error_code, m.last_error
        FROM moved m
    ),
    audited AS (
        INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic, tenant_id, dedupe_key,
                                     ordering_key, sequence_id, error_code, error_message, operator, reason)
        SELECT m.id, m.attempt_count, 'REPLAYED', m.namespace, m.topic, m.tenant_id, m.dedupe_key,
               m.ordering_key, m.sequence_id, m.last_error_code, m.last_error,
               coalesce(p_operator, session_user), p_reason
        FROM moved m
    )
    SELECT m.id FROM moved m ORDER BY m.failed_at, m.id;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION outbox.stats()
RETURNS TABLE(namespace text, topic text, pending bigint, due bigint, leased bigint,
              expired_leases bigint, oldest_pending_age_seconds double precision, dead bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH p AS (
        SELECT p.namespace, p.topic,
               count(*) AS pending,
               count(*) FILTER (WHERE p.lease_token IS NULL AND p.next_attempt_at <= now()) AS due,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL) AS leased,
               count(*) FILTER (WHERE p.lease_token IS NOT NULL AND p.lease_expires_at <= now()) AS expired_leases,
               -- Age since the message became available, so that messages
               -- scheduled for later do not read as stuck.
               extract(epoch FROM now() - min(p.available_at) FILTER (WHERE p.available_at <= now()))::double precision AS oldest
        FROM outbox.pending p
        GROUP BY p.namespace, p.topic
    ),
    d AS (
        SELECT d.namespace, d.topic, count(*) AS dead
        FROM outbox.dead d
        GROUP BY d.namespace, d.topic
    )
    SELECT coalesce(p.namespace, d.namespace), coalesce(p.topic, d.topic),
           coalesce(p.pending, 0), coalesce(p.due, 0), coalesce(p.leased, 0),
           coalesce(p.expired_leases, 0), coalesce(greatest(p.oldest, 0), 0), coalesce(d.dead, 0)
    FROM p
    FULL JOIN d ON d.namespace = p.namespace AND d.topic = p.topic
    ORDER BY 1, 2
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION outbox.purge(
    p_attempts_older_than interval,
    p_dedupe_older_than   interval,
    p_max_rows            int)
RETURNS TABLE(purged_attempts bigint, purged_dedupe bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_attempts bigint := 0;
    v_dedupe   bigint := 0;
BEGIN
    IF p_max_rows IS NULL OR p_max_rows < 1 OR p_max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox.purge: p_max_rows must be between 1 and 1000000, got %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    IF p_attempts_older_than < interval '0' OR p_dedupe_older_than < interval '0' THEN
        RAISE EXCEPTION 'outbox.purge: retention intervals must not be negative' USING ERRCODE = '22023';
    END IF;

    -- A NULL interval leaves that table alone. The history of a message
    -- that is still pending or dead is kept whatever its age: it is what an
    -- operator reads when deciding what to do with it.
    IF p_attempts_older_than IS NOT NULL THEN
        PERFORM set_config('outbox.purge_in_progress', 'on', true);
        DELETE FROM outbox.attempts a
        WHERE a.id IN (
            SELECT o.id FROM outbox.attempts o
            WHERE o.created_at < now() - p_attempts_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = o.message_id)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = o.message_id)
            LIMIT p_max_rows);
        GET DIAGNOSTICS v_attempts = ROW_COUNT;
        PERFORM set_config('outbox.purge_in_progress', 'off', true);
    END IF;

    -- A dedupe key outlives its message only by the retention window; while
    -- the message is still pending or dead, its key stays.
    IF p_dedupe_older_than IS NOT NULL THEN
        DELETE FROM outbox.dedupe x
        USING (
            SELECT k.namespace, k.topic, k.dedupe_key FROM outbox.dedupe k
            WHERE k.created_at < now() - p_dedupe_older_than
              AND NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = k.message_id)
              AND NOT EXISTS (SELECT 1 FROM outbox.dead d WHERE d.id = k.message_id)
            LIMIT p_max_rows) doomed
        WHERE x.namespace = doomed.namespace AND x.topic = doomed.topic AND x.dedupe_key = doomed.dedupe_key;
        GET DIAGNOSTICS v_dedupe = ROW_COUNT;
    END IF;

    RETURN QUERY SELECT v_attempts, v_dedupe;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION outbox.settle_unsettled(int);
DROP FUNCTION outbox.settle_keys(text[], text[], boolean);
DROP FUNCTION outbox.lock_keys(text[], text[]);

DROP INDEX outbox.pending_lease_expiry;
DROP INDEX outbox.pending_failing_heads;
DROP INDEX outbox.dead_key;
DROP INDEX outbox.dead_key_holder;
DROP INDEX outbox.pending_key_head;
DROP INDEX outbox.pending_claimable;
DROP INDEX outbox.pending_key_sequence;
-- +goose StatementBegin
DO $$
BEGIN
    CREATE UNIQUE INDEX pending_ordering_key_sequence ON outbox.pending (ordering_key, sequence_id) WHERE ordering_key IS NOT NULL;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'cannot roll back migration 5: two namespaces hold the same sequence id of one ordering key, which a global key cannot order'
        USING ERRCODE = '55000', HINT = 'Deliver or discard the messages of one of them first.';
END;
$$;
-- +goose StatementEnd
CREATE INDEX pending_claimable ON outbox.pending (next_attempt_at, id) WHERE lease_token IS NULL;

CREATE TABLE outbox.sequences_global (
    ordering_key     text        PRIMARY KEY,
    last_sequence_id bigint      NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox.sequences_global (ordering_key, last_sequence_id, updated_at)
SELECT s.ordering_key, max(s.last_sequence_id), max(s.updated_at) FROM outbox.sequences s GROUP BY s.ordering_key;
DROP TABLE outbox.sequences;
ALTER TABLE outbox.sequences_global RENAME TO sequences;
ALTER TABLE outbox.sequences RENAME CONSTRAINT sequences_global_pkey TO sequences_pkey;
COMMENT ON TABLE outbox.sequences IS 'Per ordering key sequence allocator; the row lock serialises producers of one key.';
DROP TABLE outbox.sequence_floor;
DROP TABLE outbox.keys;
DROP TABLE outbox.unsettled_keys;
DROP TABLE outbox.limits;
DROP TABLE outbox.producer_namespaces;
ALTER TABLE outbox.dedupe DROP COLUMN settled_at;

ALTER TABLE outbox.attempts
    DROP COLUMN db_user,
    DROP COLUMN note,
    DROP CONSTRAINT attempts_state_valid,
    -- DISCARDED rows stay in the archive; only new rows are checked.
    ADD CONSTRAINT attempts_state_valid CHECK (state IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'ZOMBIE_REQUEUE', 'REPLAYED')) NOT VALID;
ALTER TABLE outbox.dead DROP COLUMN holds_key, DROP COLUMN payload_bytes;
ALTER TABLE outbox.pending DROP COLUMN behind, DROP COLUMN payload_bytes, DROP COLUMN failing_since, DROP COLUMN park_on_dead;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    outbox.claim_batch(int, text, int, text[]),
    outbox.complete_batch(text, jsonb, int),
    outbox.purge(interval, interval, int),
    outbox.stats()
TO outbox_dispatcher;
GRANT EXECUTE ON FUNCTION outbox.stats() TO outbox_operator, outbox_reader;
