-- +goose Up
-- Per-target delivery gates, shared by every concurrent dispatcher: a
-- circuit breaker and a token bucket per target (the route target's key),
-- read and written only by outbox.gate_targets and
-- outbox.record_target_outcomes; outbox.open_breakers shows them. They
-- belong to outbox_owner, as everything in the schema.
SET LOCAL ROLE outbox_owner;

CREATE TABLE outbox.breakers (
    target      text PRIMARY KEY,
    -- Consecutive retryable failures recorded while closed.
    failures    int NOT NULL DEFAULT 0 CHECK (failures >= 0),
    -- Open since (NULL: closed); the next probe is due at probe_at, and
    -- probe_by is the worker that won the current probe.
    opened_at   timestamptz,
    probe_at    timestamptz,
    probe_by    text,
    last_error  text,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((opened_at IS NULL) = (probe_at IS NULL))
);

CREATE TABLE outbox.rate_limits (
    target      text PRIMARY KEY,
    -- Tokens in the bucket as of refilled_at (at most one second's worth).
    tokens      double precision NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz NOT NULL,
    -- Messages held back reserve the bucket's next free slots, one per
    -- message at the rate: the next held message goes no earlier.
    held_until  timestamptz
);

REVOKE ALL ON outbox.breakers, outbox.rate_limits FROM PUBLIC;
GRANT SELECT ON outbox.breakers, outbox.rate_limits TO outbox_operator, outbox_reader;

-- +goose Down
SET LOCAL ROLE outbox_owner;
SET LOCAL ROLE outbox_owner;
DROP TABLE IF EXISTS outbox.rate_limits;
DROP TABLE IF EXISTS outbox.breakers;
