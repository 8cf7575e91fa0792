-- +goose Up
-- The archive's primary key leads with the message: (message_id, id)
-- instead of (id, message_id). Every reader of the archive finds its rows
-- by message — a message's history, the purge's lookups, a dropped day's
-- survivors, an id prefix's range — and the key now serves them all, so
-- attempts_by_message, the index that did, goes. A completion then writes
-- one index entry fewer a message: about 3% of the database's CPU a
-- message (docs/PERFORMANCE.md).
--
-- The key is rebuilt on every partition in this transaction. Until it is
-- done, completions (which append to the archive) wait; claims and reads
-- do not. It takes about as long as building one index over the archive:
-- purge first to shorten it.
SET LOCAL ROLE outbox_owner;
ALTER TABLE outbox.attempts
    DROP CONSTRAINT attempts_pkey,
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (message_id, id);
DROP INDEX outbox.attempts_by_message;
ANALYZE outbox.attempts;

-- +goose Down
SET LOCAL ROLE outbox_owner;
CREATE INDEX attempts_by_message ON outbox.attempts (message_id);
ALTER TABLE outbox.attempts
    DROP CONSTRAINT attempts_pkey,
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (id, message_id);
