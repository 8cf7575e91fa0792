// Package lambdaemu is a local emulation of the AWS Lambda service that
// runs the real compiled bootstrap binaries as Lambda would, so that a
// test or a benchmark measures the deployment — schedules, concurrency,
// cold starts, timeouts, self-invocation — and not only the engine.
//
//	SDK client (a test, or a function's own,
//	via AWS_ENDPOINT_URL_LAMBDA)
//	   │ POST /2015-03-31/functions/{name}/invocations
//	   ▼
//	Invoke API ── RequestResponse ──► acquire ──► execute ──► 200 + answer
//	   │                                 └─ nothing free: 429
//	   └──────── Event ──► 202
//	                        │
//	Schedule (rate,         ▼
//	compressed) ───► per-function queue ──► acquire ──► execute
//	                  throttled: backoff     failed: retried, up to
//	                  too old: dropped       MaximumRetryAttempts
//
// acquire gives an invocation the most recently used idle environment,
// else a new one if the function's concurrency allows; execute cold-starts
// a new environment, hands the event to the bootstrap through its own
// Runtime API (shared/testkit/lambdatest) and enforces the deadline by SIGKILL.
//
// # What is emulated faithfully
//
// Execution environments: each is one bootstrap process with its own
// Runtime API endpoint, started on demand (a cold start: process start up
// to its first poll, bounded by InitTimeout) and reused while warm, so
// globals, connection pools and the cold-start flag survive between
// invocations exactly as on Lambda. Between invocations the process is
// stopped (SIGSTOP) and continued when the next one arrives, as Lambda
// freezes an idle sandbox: nothing runs in the background of an idle
// environment. One left idle for IdleLifetime is shut down: SIGTERM, then
// SIGKILL after ShutdownGrace.
//
// Concurrency: an environment counts against its function's limit from
// the moment it is given an invocation (cold start included) until the
// invocation ends. Functions with ReservedConcurrency have that many at
// most; the others share the account's pool (Options.AccountConcurrency
// less what is reserved). A RequestResponse call that finds no capacity is
// answered 429 TooManyRequestsException with Lambda's Reason.
//
// Timeouts and crashes: at the function's Timeout the environment is
// killed (Lambda stops the runtime) and the invocation answered
// Sandbox.Timedout; a process that exits mid-invocation is answered
// Runtime.ExitError. Either way the environment is gone and the next
// invocation cold-starts.
//
// Asynchronous invocation: Event calls are accepted (202) into a queue per
// function and run when capacity allows. A throttled event is tried again
// after a backoff doubling from ThrottleBackoff to MaxThrottleBackoff
// (Lambda documents 1 s to 5 min); like Lambda's poller, the queue is not
// told when capacity frees up. An event that has not succeeded within
// MaximumEventAge is dropped, and a failed one is retried
// MaximumRetryAttempts times, n × RetryDelay after its n-th failure; the
// emulator counts both kinds of drop.
//
// The Invoke API: function names as a name, a partial or a full ARN, with
// $LATEST as the only qualifier; invocation types RequestResponse, Event
// and DryRun; the answers' headers (x-amzn-RequestId, the request id the
// runtime saw; X-Amz-Function-Error; X-Amz-Executed-Version); errors in
// Lambda's wire format (the same code as shared/testkit/awsfake/lambdafake); the
// payload limits. Every function gets AWS_ENDPOINT_URL_LAMBDA pointing at
// the emulator, so a function that invokes itself or another function with
// the real SDK client reaches the emulation.
//
// Schedules: EventBridge Scheduler rate expressions invoking a function
// asynchronously, optionally compressed (a "minute" of 5 s); a Schedule's
// String says what the compression was, and reports must quote it.
//
// # What is not
//
//   - Memory: MemoryMB is not enforced (it is passed to the function, used
//     for GB-seconds, and the peak resident memory is recorded).
//   - CPU, by default: every process shares this machine's cores, where
//     Lambda gives a 256 MB function a fraction of a vCPU. With
//     [Options.CPU] set to [CPULambdaShare] each environment runs in its
//     own cgroup v1 CPU group with a CFS quota of MemoryMB ÷ 1,769 MB of
//     every 100 ms period (256 MB: 14,471 µs), as Lambda shares CPU; the
//     groups are removed at Close, [Emulator.CPUStat] reads their
//     throttling, and [Emulator.CPUShareStatus] says whether the cap is on
//     (it needs root and the cgroup v1 CPU controller; without them the
//     emulator runs unlimited and says why). Even capped, an environment
//     may wait for a core that PostgreSQL or another environment holds.
//   - Network: every call is on loopback, without Lambda's or a VPC's
//     latency; the Invoke API adds no service-side latency to an
//     invocation beyond its own HTTP round trip.
//   - Placement: Lambda may start a new environment even when one is idle
//     (or keep one warm for longer, or recycle one early); here the most
//     recently used idle environment is always reused, and an idle one
//     lives exactly IdleLifetime.
//   - Burst limits on scaling (how many new environments per second),
//     provisioned concurrency, SnapStart, versions and aliases, function
//     URLs, event source mappings, destinations (on-success, on-failure)
//     and dead-letter queues: dropped events are only counted.
//   - Extensions and the Telemetry API; X-Amz-Log-Type Tail (no log tail
//     in answers); the platform's START/END/REPORT lines (the Invocation
//     records carry their figures instead).
//   - The account's API rate limits and Lambda's own retries of Invoke
//     calls that fail inside the service.
//
// # Observation
//
// Per function: every invocation (type, trigger, queue, start, invoke and
// end times, environment, cold start, outcome, payload, answer), the drops,
// the concurrency after every change, the counters ([Stats]: cold starts,
// throttles, timeouts, kills, GB-seconds, maxima), and every line the
// environments printed, tagged with the invocation that printed it (EMF
// metrics and JSON logs): [Emulator.Logs], or [Options.OnLog] as they
// arrive.
//
// # Faults
//
// [Emulator.KillBusy] kills an environment in the middle of an invocation
// now; [Emulator.InjectKills] kills a share of later invocations at a
// random moment within a window. Both SIGKILL the process: the invocation
// is recorded as killed, the environment is gone.
//
// The package is a harness: no product package may import it.
package lambdaemu
