// Package lease is the dispatcher side of the outbox: it claims messages
// under a lease, records their outcomes, repairs expired leases, replays dead
// letters and reads the queue's statistics. Each method is one call to one
// SECURITY DEFINER function in schema outbox (migrations/), so each is one
// database round trip whatever the batch size, and the state machine lives in
// exactly one place: the database.
//
// # The lease state machine
//
//	            outbox.enqueue (producer's transaction)
//	                       │
//	                       ▼
//	┌──────────────► pending, unleased ◄─────────────────────────┐
//	│                      │ ClaimBatch: due, head of its          │
//	│                      │ ordering key, FOR UPDATE SKIP LOCKED; │
//	│                      │ fresh lease_token, attempt + 1        │
//	│                      ▼                                       │
//	│               pending, leased ──── lease expires ──► RepairExpiredLeases
//	│                      │                                (ZOMBIE_REQUEUE, due now;
//	│        CompleteBatch │ (token, worker and expiry        dead at the ceiling)
//	│          checked; a mismatch is lease_lost and writes nothing)
//	│      ┌───────────────┼────────────────────┐
//	│      ▼               ▼                    ▼
//	│  DISPATCHED      RETRYABLE             FAILED, or RETRYABLE
//	│  row deleted     lease cleared,        at the attempt ceiling
//	│                  due at retry_at ──┐   row moved to outbox.dead
//	│                                    │          │
//	└────────────────────────────────────┘          │ ReplayDead (REPLAYED:
//	◄───────────────────────────────────────────────┘  same id and sequence id,
//	                                                    attempt count 0)
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
