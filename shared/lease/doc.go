// Package lease is the dispatcher side of the outbox: it claims messages
// under a lease, records their outcomes, repairs expired leases, replays and
// discards dead letters, lists blocked keys and reads the queue's
// statistics. Each method is one call to one SECURITY DEFINER function in
// schema outbox (migrations/), so each is one database round trip whatever
// the batch size, and the state machine lives in exactly one place: the
// database.
//
// # The lease state machine
//
//	         outbox.enqueue (in the producer's transaction)
//	                    │
//	                    ▼
//	┌─────────► pending, unleased ◄──────────────────────────────┐
//	│                   │                                        │
//	│                   │ ClaimBatch: due heads, SKIP LOCKED,    │ takeover, by any ClaimBatch
//	│                   │ each with its run; one lease token,    │ or RepairExpiredLeases:
//	│                   │ attempt + 1                            │ lease expired, due now
//	│                   │                                        │ (ZOMBIE_REQUEUE; dead at
//	│                   ▼                                        │ the attempt ceiling)
//	│            pending, leased ────────────────────────────────┘
//	│                   │
//	│                   │ CompleteBatch: worker, token and expiry checked;
//	│                   │ a mismatch is lease_lost and writes nothing
//	│     ┌─────────────┼──────────────────┬───────────────────────┐
//	│     ▼             ▼                  ▼                       ▼
//	│ DISPATCHED    RETRYABLE          RELEASED                FAILED (or RETRYABLE at
//	│ row deleted   lease cleared,     lease cleared, the      the attempt ceiling):
//	│               due at retry_at    claim's attempt taken   row moved to outbox.dead
//	│                   │              back, nothing archived     │
//	└───────────────────┴──────────────────┘                      │ ReplayDead: same id and
//	◄─────────────────────────────────────────────────────────────┘ sequence id, attempt count 0
//	                                                              (REPLAYED); Discard: gone for
//	                                                              good (DISCARDED)
//
// Every transition but RELEASED appends one row to the append-only
// outbox.attempts.
//
// # Ordering keys, heads and runs
//
// An ordering key is scoped by its namespace. Its messages get increasing
// sequence ids (in commit order: the key's producers are serialised) and
// are delivered one claim at a time, in that order:
//
//   - Only a key's head — its lowest pending message — can be claimed; the
//     rest wait behind it (outbox.pending.behind) and are invisible to the
//     claim's index scan, so a stuck key with a million messages behind it
//     costs other claims nothing.
//   - A claim takes a head and, with ClaimParams.MaxRun, up to MaxRun-1 of
//     the messages queued behind it: the key's run, in sequence order,
//     ending before the first message that is not due. The whole run is
//     under the claim's one lease token, and the head stays the head until
//     it is delivered or dead, so at most one claim is ever in flight on a
//     key (the unique index pending_key_head guarantees it).
//   - A run's lease is its head's: the head row is leased and records the
//     run's last sequence id (outbox.pending.run_through); the messages
//     behind it are read, not written, and are fenced by the head's token,
//     holder and expiry. Their attempt is charged when their outcome is
//     recorded (a RELEASED one is never charged), and by the reaper if the
//     lease runs out. Writing one row per run rather than one per message
//     is what makes a claim of ordered keys cost less than an unordered
//     claim of the same size (docs/BENCHMARKS.md). A caller that records a
//     run's outcomes one message at a time, in order, keeps the run's
//     lease: it passes to the first message of the run not yet recorded.
//   - The dispatcher delivers a run in order and completes it in one call:
//     the messages before the first one not delivered as DISPATCHED, that
//     one as RETRYABLE or FAILED, the rest as RELEASED — given back
//     untouched, to be claimed again behind it.
//   - When a key's head leaves pending, its next message becomes the head
//     (the key is "settled"). Producers settle at commit, so a key that had
//     nothing pending gets its first message as its head; dispatchers never
//     wait for a producer's transaction, and a key they cannot settle right
//     away is settled by the next claim.
//
// # A dead head: skip or park
//
// What the death of an ordered message does to its key is the route's
// on_dead, reported with each result (Result.OnDead) and remembered on the
// message for a death by the reaper:
//
//   - skip (the default): the key's next message goes. If the dead message
//     is replayed later, it is delivered as the key's next message — out of
//     its original sequence, which its REPLAYED attempt notes.
//   - park: the dead message holds its key (DeadLetter.HoldsKey); the key's
//     later messages wait, in order, until it is replayed (it goes first,
//     and the key continues behind it) or discarded by an operator with a
//     reason (Discard; the next message goes).
//
// A key that cannot move — its head retrying, leased past its expiry, or
// parked, or the key left without a head by a settle a producer's lock
// deferred (unsettled) — is listed by BlockedKeys and counted in
// TopicStats: one definition, in outbox.blocked_key_states, serves both.
//
// # The operator's console
//
// ListPending says where each pending message stands and what an ordered
// one waits behind. RetryNow moves a retrying message's next attempt to
// now (RESCHEDULED), PurgeDead discards dead letters older than a window,
// and Pause keeps a namespace or topic out of every claim until Resume:
// its messages carry outbox.pending.paused, which keeps them out of the
// claim's index as behind does, so a paused backlog costs claims nothing;
// a run stops before a paused message (a key may span topics). Each action
// is audited with the operator, the login and a reason, and refused with
// ErrRefused (P7005) for the state of what it names.
//
// # Takeover
//
// A lease that expired — its dispatcher crashed, or stalled past it — is
// taken over by the next claim of its namespace, in the same call: the
// messages are requeued (a ZOMBIE_REQUEUE each, naming the holder; a dead
// letter at the attempt ceiling) and may be claimed again at once. An
// ordered key's run is taken over whole, by one claimer. RepairExpiredLeases
// does the same for the namespaces no dispatcher claims; the logic is one
// SQL function, outbox.requeue_expired_leases, for both. Without an expired
// lease a claim pays one index probe for it.
//
// # Fencing
//
// A worker may only complete what it still holds: the completion names the
// worker and the lease token it was given, and the database checks both and
// the expiry (by the clock, not the transaction's start) under a row lock.
// A worker that stalled past its lease (while the reaper requeued its
// messages and another worker claimed them) gets [outboxtype.StatusLeaseLost] from
// CompleteBatch, or ErrLeaseLost from Complete, and writes nothing. Keep the
// lease longer than the longest the work can take.
//
// # What a claim loads
//
// A claim is bounded by ClaimParams.MaxBytes of payload as well as by
// BatchSize, and a message whose payload is larger than
// ClaimParams.MaxPayloadBytes (the most any route may send) comes back
// without it ([outboxtype.Message.PayloadOmitted]): the dispatcher dead-letters it
// without ever loading it. A stored row the dispatcher cannot decode comes
// back with [outboxtype.Message].DecodeError set, for that message alone to fail.
//
// # Errors
//
// SQLSTATEs are translated in one place (errors.go) into *Error values that
// wrap a sentinel — ErrLeaseLost (P7002), ErrInvalidCompletion (P7003),
// ErrRefused (P7005), ErrInvalidArgument (22023), ErrAppendOnly (P0001), ErrDoubleDispatch (23505
// on attempts_one_dispatched_per_message or a partition's copy of it) — and
// the driver's error.
// CompleteBatch reports a second DISPATCHED for one message as that
// message's [outboxtype.StatusDoubleDispatch], not as an error of the batch.
package lease
