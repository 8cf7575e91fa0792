-- Wake long-running dispatchers (outboxctl serve) as soon as messages are
-- committed, instead of waiting for their next poll: every statement that
-- inserts into outbox.pending — an enqueue, a batch enqueue, a dead-letter
-- replay — sends one notification on channel 'outbox_pending'. The payload is
-- empty: a listener only learns "there is new work" and claims it through
-- outbox.claim_batch as usual, so a lost notification costs latency, never a
-- message (serve also polls).
--
-- What it costs producers:
--
--   * One pg_notify per INSERT statement (FOR EACH STATEMENT, not per row),
--     so an enqueue_batch of 1,000 messages notifies once, not 1,000 times.
--   * PostgreSQL folds identical notifications (same channel, same payload)
--     raised in one transaction into one, so a transaction that enqueues many
--     times still delivers a single notification, at commit. A rolled-back
--     transaction notifies nobody.
--   * At commit, a notifying transaction appends to the cluster-wide
--     notification queue under a global lock that is held until the commit
--     record is flushed: commits of notifying transactions are serialised
--     with each other (not with other commits). At the rates one outbox sees
--     (thousands of producer commits per second) that is a small cost; far
--     beyond it, or when no one listens (only the Lambda functions run),
--     switch it off without a migration and rely on polling:
--         ALTER TABLE outbox.pending DISABLE TRIGGER pending_notify;
--   * Nothing is queued when no session is listening. A listener that stops
--     reading while holding a transaction open keeps the queue from being
--     trimmed (8 GB at most, then notifying commits fail); serve reads
--     notifications on a dedicated connection that never opens a transaction.
--
-- Updates (a retry becoming due, a repaired lease) do not notify: those
-- messages are found by the next poll.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION outbox.notify_pending() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('outbox_pending', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox.notify_pending() IS 'Trigger: one NOTIFY outbox_pending per statement that inserts into outbox.pending (folded per transaction).';

-- Only the trigger calls it; like the other outbox functions it is not
-- executable by PUBLIC.
REVOKE ALL ON FUNCTION outbox.notify_pending() FROM PUBLIC;

CREATE TRIGGER pending_notify
    AFTER INSERT ON outbox.pending
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_pending();

-- +goose Down
DROP TRIGGER pending_notify ON outbox.pending;
DROP FUNCTION outbox.notify_pending();
