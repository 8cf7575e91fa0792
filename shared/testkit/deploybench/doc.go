// Package deploybench measures the serverless deployment as it runs: the
// real dispatch bootstrap under the Lambda emulation
// (shared/testkit/lambdaemu), invoked by the template's schedule (in real
// time by default), configured with the template's settings, while producers
// commit at a constant offered rate and a webhook target answers after a
// fixed latency (shared/testkit/workload). It reports the commit-to-receipt
// latency of every message, the throughput, the database's claims per
// second and what the emulated Lambda service saw.
//
// Three questions, one Run each: the latency of an offered load (Rate),
// how fast a backlog drains (Backlog, committed before the first tick and
// measured apart), and what an idle deployment costs (Rate 0: the claims
// per second with no traffic, and GB-seconds). A backlog's drain may go
// to an EventBridge endpoint answering at once (Target, BulkBacklog), so
// that the target is not what is measured, and a run may end once
// drained (StopWhenDrained) instead of waiting for lingering invocations.
// The report says where the run's CPU went (workload.CPUMeter). FunctionEnv,
// ReservedConcurrency and Async set the deployment's knobs beyond the
// template's defaults.
//
// InvocationDrain asks a fourth question: what one warm invocation alone
// (no schedule, fan-out or linger) drains, optionally at the CPU share
// Lambda gives its memory (lambdaemu.CPULambdaShare), with the bootstrap's
// CPU per message; ReadTemplate reads the memory size and
// DispatchMaxWorkers from template.yaml. make bench-deployment prints it
// unconstrained and at the share; make bench-lambda-share compares it with
// the bare-SQL floor; BenchmarkInvocationDrain gives it per target.
//
// Run reads no flags and fails on nothing slow: it is called by
// shared/testkit/deploybench/cmd/deploybench (make bench-deployment) and
// can be called by the benchmark comparison in bench/, which requires this
// module.
//
// What the figures mean, and do not: the deployment's shape (a dispatch
// invocation per tick that lingers until its deadline less the safety
// margin, workers started by fan-out on a backlog, reserved concurrency,
// environments reused and frozen between invocations) is emulated
// faithfully; the machine is not Lambda's (every process shares this
// machine's cores with PostgreSQL, calls are on loopback). The schedule
// ticks in real time unless Compression says otherwise, and the report says
// so; the first tick comes at once, as in a deployment already running.
// The function timeout and the engine's own durations (safety margin,
// lease) are never compressed: a compressed schedule stacks lingering
// invocations up to the reserved concurrency. X-Ray tracing
// (the template's Tracing: Active) is off: there is no daemon to send to.
package deploybench
