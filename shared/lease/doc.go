// Package lease is the dispatcher side of the outbox: it claims messages
// under a lease, records their outcomes, repairs expired leases, replays dead
// letters and reads the queue's statistics. Each method is one call to one
// SECURITY DEFINER function in schema outbox (migrations/), so each is one
// database round trip whatever the batch size, and the state machine lives in
// exactly one place: the database.
//
// # The lease state machine
//
//	         outbox.enqueue (in the producer's transaction)
//	                    │
//	                    ▼
//	┌─────────► pending, unleased ◄────────────────────────┐
//	│                   │                                  │
//	│                   │ ClaimBatch: due, head of its     │ RepairExpiredLeases:
//	│                   │ ordering key, SKIP LOCKED;       │ lease expired, due now
//	│                   │ fresh lease_token, attempt + 1   │ (ZOMBIE_REQUEUE; dead at
//	│                   ▼                                  │ the attempt ceiling)
//	│            pending, leased ──────────────────────────┘
//	│                   │
//	│                   │ CompleteBatch: worker, token and expiry checked;
//	│                   │ a mismatch is lease_lost and writes nothing
//	│       ┌───────────┼──────────────────────┐
//	│       ▼           ▼                      ▼
//	│  DISPATCHED    RETRYABLE             FAILED (or RETRYABLE at
//	│  row deleted   lease cleared,        the attempt ceiling):
//	│                due at retry_at       row moved to outbox.dead
//	│                   │                      │
//	└───────────────────┘                      │ ReplayDead: same id and
//	◄──────────────────────────────────────────┘ sequence id, attempt count 0
//	                                             (REPLAYED)
//
// Every transition appends one row to the append-only outbox.attempts.
//
// # Fencing
//
// A worker may only complete what it still holds: the completion names the
// worker and the lease token it was given, and the database checks both and
// the expiry under a row lock. A worker that stalled past its lease (while
// the reaper requeued its messages and another worker claimed them) gets
// StatusLeaseLost from CompleteBatch, or ErrLeaseLost from Complete, and
// writes nothing. Keep the lease longer than the longest the work can take.
//
// # Errors
//
// SQLSTATEs are translated in one place (errors.go) into *Error values that
// wrap a sentinel — ErrLeaseLost (P7002), ErrInvalidCompletion (P7003),
// ErrInvalidArgument (22023), ErrAppendOnly (P0001), ErrDoubleDispatch (23505
// on attempts_one_dispatched_per_message) — and the driver's error.
package lease
