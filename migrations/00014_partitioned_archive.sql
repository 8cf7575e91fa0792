-- +goose Up
-- The archive, outbox.attempts, partitioned by day so that retention drops a
-- whole day at once instead of deleting it row by row (dead tuples, index
-- bloat, vacuum work: 86M rows a day at 1,000 messages/s).
--
-- The partition key is message_id. Every message id is a UUIDv7 the
-- database made at enqueue (outbox.uuid_v7, enqueue_batch), so its top 48
-- bits are the message's creation time in Unix milliseconds: a day's range
-- runs from the UUIDv7 of 00:00 UTC that day (time bits, the rest zero) to
-- the next day's. All the attempts of one message live in one partition, so
-- the unique index that refuses a second DISPATCHED row stays global (the
-- key is in it) and a lookup by message_id reads one partition. A DEFAULT
-- partition takes whatever no day covers: a day whose partition was not
-- made in time, a dropped day's survivors (see outbox.purge), an id that is
-- not a v7. outbox.ensure_archive_partitions makes the days ahead.
--
-- This rewrites the archive: its rows are copied into the partitions, in
-- one transaction, which takes as long as the archive is large (purge it
-- first to shorten it). Days of the last 62 get a partition each; older
-- rows go to DEFAULT, where retention deletes them row by row as before.
SET LOCAL ROLE outbox_owner;

ALTER TABLE outbox.attempts RENAME TO attempts_unpartitioned;
ALTER SEQUENCE outbox.attempts_id_seq RENAME TO attempts_unpartitioned_id_seq;
ALTER TABLE outbox.attempts_unpartitioned RENAME CONSTRAINT attempts_pkey TO attempts_unpartitioned_pkey;
DROP INDEX outbox.attempts_one_dispatched_per_message, outbox.attempts_by_message, outbox.attempts_created_at;

CREATE TABLE outbox.attempts (
    id            bigint      GENERATED ALWAYS AS IDENTITY,
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
    -- A partitioned table's unique keys hold its partition key.
    CONSTRAINT attempts_pkey PRIMARY KEY (id, message_id),
    CONSTRAINT attempts_state_valid CHECK (state IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'ZOMBIE_REQUEUE',
                                                     'REPLAYED', 'DISCARDED', 'RESCHEDULED')),
    CONSTRAINT attempts_attempt_no_nonnegative CHECK (attempt_no >= 0)
) PARTITION BY RANGE (message_id);
COMMENT ON TABLE outbox.attempts IS 'Append-only archive: one row per outcome, one partition per UTC day of the message''s creation (its UUIDv7). Only outbox.purge() deletes, for retention.';
COMMENT ON COLUMN outbox.attempts.db_user IS 'The database login (session_user) that made an operator action, beside the operator name it gave.';

CREATE TABLE outbox.attempts_default PARTITION OF outbox.attempts DEFAULT;

-- +goose StatementBegin
DO $$
DECLARE
    v_today date := (now() AT TIME ZONE 'UTC')::date;
    v_day   date;
BEGIN
    FOR v_day IN
        SELECT d FROM (
            SELECT DISTINCT (to_timestamp(('x' || substr(replace(u.message_id::text, '-', ''), 1, 12))::bit(48)::bigint / 1000.0)
                             AT TIME ZONE 'UTC')::date AS d
            FROM outbox.attempts_unpartitioned u
            WHERE substr(u.message_id::text, 15, 1) = '7'
            UNION
            SELECT generate_series(v_today, v_today + 3, interval '1 day')::date) days
        WHERE d BETWEEN v_today - 62 AND v_today + 3
        ORDER BY d
    LOOP
        EXECUTE format('CREATE TABLE outbox.%I PARTITION OF outbox.attempts FOR VALUES FROM (%L) TO (%L)',
            'attempts_p' || to_char(v_day, 'YYYYMMDD'),
            (lpad(to_hex((extract(epoch FROM v_day::timestamp AT TIME ZONE 'UTC') * 1000)::bigint), 12, '0') || repeat('0', 20))::uuid,
            (lpad(to_hex((extract(epoch FROM (v_day + 1)::timestamp AT TIME ZONE 'UTC') * 1000)::bigint), 12, '0') || repeat('0', 20))::uuid);
    END LOOP;
END;
$$;
-- +goose StatementEnd

INSERT INTO outbox.attempts OVERRIDING SYSTEM VALUE SELECT * FROM outbox.attempts_unpartitioned;
-- Ids go on from where they were, never reused.
SELECT setval(pg_get_serial_sequence('outbox.attempts', 'id'), s.last_value, s.is_called)
FROM outbox.attempts_unpartitioned_id_seq s;
DROP TABLE outbox.attempts_unpartitioned;

-- The indexes, built once the rows are in, on every partition (and every
-- partition made later).
CREATE UNIQUE INDEX attempts_one_dispatched_per_message ON outbox.attempts (message_id) WHERE state = 'DISPATCHED';
COMMENT ON INDEX outbox.attempts_one_dispatched_per_message IS 'At most one DISPATCHED outcome per message; a violation is a double-delivery bug.';
CREATE INDEX attempts_by_message ON outbox.attempts (message_id);
CREATE INDEX attempts_created_at ON outbox.attempts USING brin (created_at);
-- Operators' actions outlive a dropped day (retention keeps them); this is
-- how a day's are found without reading the day.
CREATE INDEX attempts_operator_actions ON outbox.attempts (message_id) WHERE state IN ('REPLAYED', 'DISCARDED', 'RESCHEDULED');
-- A dropped day's delivered messages whose dedupe keys are still kept: the
-- outcome's time moves into the key (settled_at), found by message id.
CREATE INDEX dedupe_by_message ON outbox.dedupe (message_id);

-- A second delivery is reported on a partition's index: its name ends as
-- the parent's, which is how it is recognised (shared/lease/errors.go).
-- +goose StatementBegin
DO $$
DECLARE
    v_index record;
BEGIN
    FOR v_index IN
        SELECT c.relname AS index_name, t.relname AS table_name
        FROM pg_catalog.pg_inherits i
        JOIN pg_catalog.pg_index x ON x.indexrelid = i.inhrelid
        JOIN pg_catalog.pg_class c ON c.oid = x.indexrelid
        JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
        WHERE i.inhparent = 'outbox.attempts_one_dispatched_per_message'::regclass
    LOOP
        EXECUTE format('ALTER INDEX outbox.%I RENAME TO %I', v_index.index_name, v_index.table_name || '_one_dispatched_per_message');
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- Readers read the archive through the parent; a partition's privileges
-- are its owner's alone (nobody reads, writes, detaches or drops one).
REVOKE ALL ON outbox.attempts FROM PUBLIC;
GRANT SELECT ON outbox.attempts TO outbox_operator, outbox_reader;

-- The append-only trigger, on the parent and on every partition (a
-- statement on a partition fires that partition's statement triggers
-- only). The function file attempts_append_only.sql puts it back on
-- whatever exists when it is applied; on a new database it is applied
-- after this migration, which then has no trigger function yet.
-- +goose StatementBegin
DO $$
DECLARE
    v_table regclass;
BEGIN
    IF to_regprocedure('outbox.attempts_append_only()') IS NULL THEN
        RETURN;
    END IF;
    FOR v_table IN SELECT 'outbox.attempts'::regclass
                   UNION ALL SELECT i.inhrelid::regclass FROM pg_catalog.pg_inherits i WHERE i.inhparent = 'outbox.attempts'::regclass LOOP
        EXECUTE format('CREATE TRIGGER attempts_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION outbox.attempts_append_only()', v_table);
    END LOOP;
END;
$$;
-- +goose StatementEnd

ANALYZE outbox.attempts;

-- +goose Down
-- Back to one plain table holding every row, ids and all.
SET LOCAL ROLE outbox_owner;
DROP INDEX IF EXISTS outbox.dedupe_by_message;
DROP FUNCTION IF EXISTS outbox.ensure_archive_partitions(integer);
DROP FUNCTION IF EXISTS outbox.drop_expired_archive_partitions(timestamptz);

CREATE TABLE outbox.attempts_plain (
    id            bigint      GENERATED ALWAYS AS IDENTITY,
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
INSERT INTO outbox.attempts_plain OVERRIDING SYSTEM VALUE SELECT * FROM outbox.attempts ORDER BY id;
SELECT setval(pg_get_serial_sequence('outbox.attempts_plain', 'id'), s.last_value, s.is_called)
FROM outbox.attempts_id_seq s;
DROP TABLE outbox.attempts;
ALTER TABLE outbox.attempts_plain RENAME TO attempts;
ALTER SEQUENCE outbox.attempts_plain_id_seq RENAME TO attempts_id_seq;
ALTER TABLE outbox.attempts ADD CONSTRAINT attempts_pkey PRIMARY KEY (id);
COMMENT ON TABLE outbox.attempts IS 'Append-only archive: one row per outcome. Only outbox.purge() deletes, for retention.';
COMMENT ON COLUMN outbox.attempts.db_user IS 'The database login (session_user) that made an operator action, beside the operator name it gave.';
CREATE UNIQUE INDEX attempts_one_dispatched_per_message ON outbox.attempts (message_id) WHERE state = 'DISPATCHED';
COMMENT ON INDEX outbox.attempts_one_dispatched_per_message IS 'At most one DISPATCHED outcome per message; a violation is a double-delivery bug.';
CREATE INDEX attempts_by_message ON outbox.attempts (message_id);
CREATE INDEX attempts_created_at ON outbox.attempts USING brin (created_at);
REVOKE ALL ON outbox.attempts FROM PUBLIC;
GRANT SELECT ON outbox.attempts TO outbox_operator, outbox_reader;
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regprocedure('outbox.attempts_append_only()') IS NOT NULL THEN
        CREATE TRIGGER attempts_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON outbox.attempts
            FOR EACH STATEMENT EXECUTE FUNCTION outbox.attempts_append_only();
    END IF;
END;
$$;
-- +goose StatementEnd
