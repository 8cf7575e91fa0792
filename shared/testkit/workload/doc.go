// Package workload drives and measures message traffic end to end, from
// the producer's commit to the target's receipt, whatever dispatches in
// between (the serverless deployment under shared/testkit/lambdaemu, the
// long-lived server, a bare engine):
//
//	Producers ──(small transactions at a constant offered rate:
//	             outbox.EnqueueBatch / Enqueue, commit time noted
//	             right after COMMIT returns)──► PostgreSQL
//	                                               │ any dispatcher
//	                                               ▼
//	Target ◄── signed webhook ── (answers after a fixed latency; the
//	           reference receiver verifies and deduplicates; the arrival
//	           of each message's first delivery is its receipt time)
//
// A Ledger holds the commit times and a Target the receipts; Measure joins
// them by message id into the commit-to-receipt latency of every message.
// For a drain whose target must not be the bottleneck, EventBus is a local
// EventBridge endpoint answering at once, and CommitBulkBacklog loads a
// backlog with INSERT ... SELECT, each payload carrying its message id
// (an EventBridge entry carries the payload alone). CPUMeter says where a
// run's CPU went: the processes it started, itself, one database's
// backends, the whole machine.
// ClaimCalls counts the database's calls of outbox.claim_batch from
// pg_stat_user_functions (EnableFunctionStats turns the counting on).
//
// The producers are open-loop: transaction k is due at start + k × (its
// messages / the rate), whether or not the ones before have committed, so
// a slow database shows as producer lag (reported), not as a lower offered
// rate hidden in the figures.
package workload
