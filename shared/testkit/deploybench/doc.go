// Package deploybench measures the serverless deployment as it runs: the
// real dispatch bootstrap under the Lambda emulation
// (shared/testkit/lambdaemu), invoked by the template's schedule
// (compressed), configured with the template's settings, while producers
// commit at a constant offered rate and a webhook target answers after a
// fixed latency (shared/testkit/workload). It reports the commit-to-receipt
// latency of every message, the throughput, the database's claims per
// second and what the emulated Lambda service saw.
//
// Three questions, one Run each: the latency of an offered load (Rate),
// how fast a backlog drains (Backlog, committed before the first tick and
// measured apart), and what an idle deployment costs (Rate 0: the claims
// per second with no traffic, and GB-seconds). FunctionEnv,
// ReservedConcurrency and Async set the deployment's knobs beyond the
// template's defaults.
//
// Run reads no flags and fails on nothing slow: it is called by
// cmd/deploybench (make bench-deployment) and can be called by the
// benchmark comparison in bench/, which requires this module.
//
// What the figures mean, and do not: the deployment's shape (one dispatch
// invocation per tick, each bounded by its batches and its deadline,
// environments reused and frozen between ticks) is emulated faithfully; the
// machine is not Lambda's (every process shares this machine's cores with
// PostgreSQL, calls are on loopback) and time is compressed: the schedule
// ticks Compression times faster than the template says, and the report
// says so. The function timeout and the engine's own durations (safety
// margin, lease) are not compressed, so an invocation can do as much per
// tick as the deployment's; a compressed tick therefore raises the
// deployment's throughput ceiling (at most OUTBOX_MAX_BATCHES ×
// OUTBOX_BATCH_SIZE messages per tick) by the same factor. X-Ray tracing
// (the template's Tracing: Active) is off: there is no daemon to send to.
package deploybench
