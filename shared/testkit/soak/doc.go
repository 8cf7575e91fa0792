// Package soak is the fault-injection soak of the dispatcher: it pushes
// messages through the real, compiled dispatch functions while it breaks
// everything it can, then proves from the target's own record what the
// promise to our users is — nothing lost, duplicates only where a fault
// made them unavoidable, order kept per key. shared/testkit/soak/cmd/soak runs the full soak
// (make soak); TestQuickSoak runs a small one in the test suite. The
// results are in docs/RELIABILITY.md.
//
// # What runs
//
//	producers (own transactions:          throwaway PostgreSQL (initdb, pg_ctl;
//	  ledger row + Enqueue/EnqueueBatch)──► restarted -m fast, then -m immediate)
//	                                                   ▲
//	8 × dispatch bootstrap ── Runtime API ── soak      │ claim / complete
//	  (SIGKILLed, relaunched)   Invoke loop ───────────┘
//	  reaper + metrics bootstrap, invoked on a compressed schedule
//	        │ signed webhooks
//	        ▼
//	fault injector ──► shared/sink receiver ──► recorder ──► in-memory deduper
//	(shared/sink/      (signature, envelope)   (every delivery that reaches
//	 faultsink: 5xx,                            deduplication, duplicates
//	 429, 4xx, timeouts,                        included: webhook-id, ordering
//	 bursts)                                    key, sequence id, arrival order)
//
// The dispatchers log in as a user granted only outbox_dispatcher, the
// producers as one granted only outbox_producer (and their ledger table).
// With Config.Pooler "pgbouncer" (SOAK_POOLER=pgbouncer) the functions
// connect through PgBouncer in transaction mode with its default settings,
// OUTBOX_DB_POOLER=transaction.
//
// # The operator, and the field's other faults
//
// Beside the kills and restarts, the schedule has what production adds:
//
//   - the operator, from separate processes (the outboxctl binary, built
//     once): pauses the topic usage_record and resumes it later; replays,
//     every ReplayEvery while the producers run, the dead letters the
//     failing target produced (those without an ordering key) and the
//     parked heads of the transfer route (on_dead: park), which releases
//     their keys; during the drain it goes on releasing parked keys;
//   - a stuck key: the target refuses every call for payments:acct-0 for
//     StuckFor while the others flow, then recovers;
//   - a lease takeover: a dispatcher holding leased rows is stopped
//     (SIGSTOP) for its lease and two reaper runs, so that the reaper or a
//     claim takes its rows over, then resumed (SIGCONT);
//   - read-only turns: ALTER SYSTEM SET default_transaction_read_only = on
//     and a reload, as a failover onto a server that is still a replica
//     looks to a warm function, then back.
//
// A pause holds a message when no call for it reaches the target between
// the pause's commit and its resume. The leases held when the pause has
// committed are listed at once: those messages are in flight and may
// finish; any other call for the topic that arrives (at the target, before
// any injected hold) inside the window is a violation, which fails the run.
//
// # How each figure is counted
//
// Committed: messages whose producer transaction committed. A producer
// whose COMMIT fails (the server restarting under it) cannot know whether
// it committed; it looks for its ledger rows once the server is back — all
// of them: committed; none: not committed; some: a torn transaction, which
// fails the run. Rolled back: messages enqueued in a transaction rolled
// back on purpose, or found not committed. The ledger's row count must
// equal the committed count at the end.
//
// Delivered: committed messages the receiver handled at least once.
// Dead: committed messages in outbox.dead. Lost: committed messages neither
// delivered nor dead — it must be 0. A message may be both (its delivery's
// answer was lost, and a later attempt was refused for good).
//
// A delivery is a call that passed the fault injector and the signature
// check and reached deduplication, and was answered 200 — as handled, or
// as a duplicate. Duplicates are deliveries beyond each message's first.
// They are bounded by the messages in flight when a fault struck: the
// distinct messages leased by a dispatcher when it was killed or stopped
// for a takeover, leased when PostgreSQL restarted or turned read-only, or still leased by a dispatcher after one of its
// invocations failed (a completion lost to the restart); plus every call
// the dispatchers sent and got no answer to (attempts archived with
// TIMEOUT, CANCELED or NETWORK); plus stale completions (lease_lost).
// Beyond the bound, each duplicated message must be explained by one of
// those, or by a ZOMBIE_REQUEUE in its history (its lease expired before
// its holder completed it); an unexplained duplicate fails the run.
//
// Order: for each ordering key, the receiver's deliveries are taken in
// arrival order (the order the recorder saw them, before deduplication),
// and only each message's first delivery counts. The sequence ids of those
// first deliveries must strictly increase: a first delivery whose sequence
// id is below one already delivered for its key is a violation. A message
// that never arrives (it is dead) leaves a gap, which is allowed; a
// duplicate of an earlier message arriving after a later message's first
// delivery is reported as a late duplicate, not as a violation (the
// receiver deduplicates it; its effect happened in order). The committed
// sequence ids of each key must also be exactly 1..n (a rolled-back
// transaction rolls its allocation back).
//
// Stale completions: the lease_lost counts of the dispatch summaries. The
// lease (10s) outlasts an invocation (6s) plus its safety margin, and the
// engine never completes past its deadline, so a completion can only go
// stale when its first try committed but the answer was lost and the engine
// retried it: they are rare by design, and every one is rejected.
package soak
