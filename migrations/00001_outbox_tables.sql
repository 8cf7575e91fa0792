-- The outbox schema: a hot, leased queue (pending), an append-only outcome
-- archive (attempts), dead letters (dead), per-key sequence allocation
-- (sequences) and the enqueue idempotency map (dedupe).
--
-- Nothing here is written directly by runtime roles: the functions in the next
-- migration are the only legal state transitions.

-- +goose Up
CREATE SCHEMA outbox;
COMMENT ON SCHEMA outbox IS 'Transactional outbox: write through outbox.enqueue() in your own transaction; dispatchers use the other functions.';

-- PostgreSQL 15 has no uuidv7(). This one follows RFC 9562 method 3, as
-- PostgreSQL 18's does: 48 bits of Unix milliseconds, then the version and 12
-- bits of sub-millisecond time, then 62 random bits (with the variant taken
-- from a v4 UUID). Ids made one after another sort in creation order, which
-- keeps the primary key append-mostly and makes (next_attempt_at, id) a FIFO.
-- Every call is schema-qualified instead of pinning search_path with SET,
-- which would cost a configuration save and restore on each of the
-- thousands of calls a batch makes.
-- +goose StatementBegin
CREATE FUNCTION outbox.uuid_v7() RETURNS uuid
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    v_ms numeric := pg_catalog.extract('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000;
    v_whole numeric := pg_catalog.floor(v_ms);
BEGIN
    RETURN pg_catalog.encode(
        pg_catalog.substr(pg_catalog.int8send(v_whole::pg_catalog.int8), 3)
        OPERATOR(pg_catalog.||) pg_catalog.int2send((28672 OPERATOR(pg_catalog.+) pg_catalog.floor((v_ms OPERATOR(pg_catalog.-) v_whole) OPERATOR(pg_catalog.*) 4096)::pg_catalog.int4)::pg_catalog.int2)  -- 0x7000: version 7
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 9),
        'hex')::pg_catalog.uuid;
END;
$$;
-- +goose StatementEnd

CREATE TABLE outbox.pending (
    id               uuid        PRIMARY KEY,
    namespace        text        NOT NULL,
    topic            text        NOT NULL,
    tenant_id        text,
    dedupe_key       text,
    ordering_key     text,
    sequence_id      bigint,
    payload          jsonb       NOT NULL,
    headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    trace_header     text,
    attempt_count    integer     NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_error_code  text,
    last_error       text,
    claimed_by       text,
    lease_token      uuid,
    lease_expires_at timestamptz,
    CONSTRAINT pending_lease_all_or_none CHECK (
        (claimed_by IS NULL AND lease_token IS NULL AND lease_expires_at IS NULL)
        OR (claimed_by IS NOT NULL AND lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT pending_ordering_key_has_sequence CHECK ((ordering_key IS NULL) = (sequence_id IS NULL)),
    -- Producers validate the character set (shared/outbox); here only the
    -- length, since a regular expression per row doubles the insert cost.
    CONSTRAINT pending_namespace_length CHECK (octet_length(namespace) BETWEEN 1 AND 128),
    CONSTRAINT pending_topic_length CHECK (octet_length(topic) BETWEEN 1 AND 128),
    CONSTRAINT pending_payload_is_document CHECK (jsonb_typeof(payload) IN ('object', 'array')),
    CONSTRAINT pending_headers_is_object CHECK (jsonb_typeof(headers) = 'object'),
    CONSTRAINT pending_attempt_count_nonnegative CHECK (attempt_count >= 0)
) WITH (
    -- Free space on each page lets claim and retry updates stay on the page.
    fillfactor = 80,
    -- The table is a queue: rows are inserted, updated a few times and
    -- deleted. Vacuum after a fixed number of dead rows rather than a
    -- fraction of a table whose size swings by orders of magnitude, and
    -- without cost-based sleeping, so dead index entries do not pile up in
    -- front of the claim scan.
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0
);
COMMENT ON TABLE outbox.pending IS 'Hot queue of undelivered messages; a row is leased while a dispatcher works on it.';

-- The claim scan: due, unleased rows in (next_attempt_at, id) order. Leased
-- rows leave this index, so concurrent claimers never wade through each
-- other's in-flight work. The predicate is static (no now()).
CREATE INDEX pending_claimable ON outbox.pending (next_attempt_at, id) WHERE lease_token IS NULL;
-- No index serves the reaper's search for expired leases on purpose: it
-- would cost every claim an index insert, and it misleads the planner into
-- nested loops over the leased rows when completing a batch. The reaper runs
-- once a minute; its sequential scan of a queue table is cheap.
-- Per-key ordering: the head of each key is the lowest sequence_id still pending.
CREATE UNIQUE INDEX pending_ordering_key_sequence ON outbox.pending (ordering_key, sequence_id) WHERE ordering_key IS NOT NULL;

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
    CONSTRAINT attempts_state_valid CHECK (state IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'ZOMBIE_REQUEUE', 'REPLAYED')),
    CONSTRAINT attempts_attempt_no_nonnegative CHECK (attempt_no >= 0)
);
COMMENT ON TABLE outbox.attempts IS 'Append-only archive: one row per outcome. Only outbox.purge() deletes, for retention.';

-- The double-delivery backstop: a message is recorded as dispatched at most once.
CREATE UNIQUE INDEX attempts_one_dispatched_per_message ON outbox.attempts (message_id) WHERE state = 'DISPATCHED';
COMMENT ON INDEX outbox.attempts_one_dispatched_per_message IS 'At most one DISPATCHED outcome per message; a violation is a double-delivery bug.';
CREATE INDEX attempts_by_message ON outbox.attempts (message_id);
-- Retention purges by age; BRIN is tiny and cheap to maintain on an
-- insert-ordered timestamp.
CREATE INDEX attempts_created_at ON outbox.attempts USING brin (created_at);

-- +goose StatementBegin
CREATE FUNCTION outbox.attempts_append_only() RETURNS trigger
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
-- +goose StatementEnd

CREATE TRIGGER attempts_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON outbox.attempts
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.attempts_append_only();

CREATE TABLE outbox.dead (
    id              uuid        PRIMARY KEY,
    namespace       text        NOT NULL,
    topic           text        NOT NULL,
    tenant_id       text,
    dedupe_key      text,
    ordering_key    text,
    sequence_id     bigint,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    trace_header    text,
    attempt_count   integer     NOT NULL,
    available_at    timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    last_error_code text,
    last_error      text,
    failed_by       text,
    failed_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE outbox.dead IS 'Dead letters: terminal failures and exhausted retries; outbox.replay_dead() moves them back.';
CREATE INDEX dead_failed_at ON outbox.dead (failed_at, id);
CREATE INDEX dead_namespace_topic ON outbox.dead (namespace, topic, failed_at);

CREATE TABLE outbox.sequences (
    ordering_key     text        PRIMARY KEY,
    last_sequence_id bigint      NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE outbox.sequences IS 'Per ordering key sequence allocator; the row lock serialises producers of one key.';

CREATE TABLE outbox.dedupe (
    namespace   text        NOT NULL,
    topic       text        NOT NULL,
    dedupe_key  text        NOT NULL,
    message_id  uuid        NOT NULL,
    sequence_id bigint,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, topic, dedupe_key)
);
COMMENT ON TABLE outbox.dedupe IS 'Enqueue idempotency: (namespace, topic, dedupe_key) -> message, kept for the retention window after delivery.';
CREATE INDEX dedupe_created_at ON outbox.dedupe USING brin (created_at);

-- +goose Down
DROP SCHEMA outbox CASCADE;
