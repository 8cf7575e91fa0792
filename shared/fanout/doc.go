// Package fanout scales the dispatch function out on a backlog: a dispatch
// invocation that finds more claimable work than it can finish before its
// deadline starts more dispatch invocations of its own function, by
// asynchronous Lambda Invoke (InvocationType Event), each with an event
// that says why:
//
//	{"source":"outbox.fanout","generation":1,"reason":"backlog","backlog":240000}
//
//	schedule tick ──► dispatch (generation 0) ── claims, measures its rate ──┐
//	                                                                         │ backlog > what it can finish?
//	                     ClaimableEstimate (one bounded count) ◄─────────────┘
//	                                  │ workers = ⌈(backlog − its own share) / one worker's share⌉,
//	                                  │ at most OUTBOX_MAX_WORKERS − 1
//	                                  ▼
//	              Invoke(Event) × workers ──► dispatch (generation 1) … ordinary claimers
//
// Workers are ordinary claimers: the claim is FOR UPDATE SKIP LOCKED, so any
// number of them share the queue without coordination, and one whose claim
// comes back empty simply returns. Nothing needs to know who is running.
//
// # Sizing
//
// The deciding invocation has measured its own rate (messages claimed per
// second by its first run). One worker's share is that rate over a whole
// invocation (the function timeout less the safety margin); its own share
// is the rate over the time it has left (nothing when it does not go on
// claiming). Both are capped at OUTBOX_FANOUT_DRAIN_WITHIN (30 s by
// default): a backlog one invocation could deliver before its deadline, but
// only in a minute, still gets the workers that drain it in 30 s. Against a
// 20 ms webhook one invocation delivers about 3,000 messages a second, a
// fifth of what the database can hand out, so waiting for the deadline
// rule alone would leave a backlog of 200,000 to one invocation for a
// minute. The backlog is read once, bounded to what the largest fleet
// could take, so a backlog of ten million costs the count of what
// OUTBOX_MAX_WORKERS workers could deliver, not of the table.
//
// # Bounds
//
//   - OUTBOX_MAX_WORKERS: one invocation starts at most this many less one
//     (itself). The template sets the function's reserved concurrency to
//     the same value, so Lambda itself enforces the bound, and with it the
//     database's connection budget (workers × pool size), whoever invokes
//     the function. An Invoke refused for want of capacity (429) is counted,
//     not an error: the workers already running are doing the job.
//   - Generations: an event carries its generation, one more than its
//     starter's; an invocation of generation OUTBOX_FANOUT_GENERATIONS or
//     more starts nothing. With the default of 1 only the schedule's
//     invocations (generation 0) fan out, and each tick re-sizes the fleet,
//     so no chain can outlive the backlog or loop.
//
// # Why not a coordinator
//
// Two alternatives were weighed. A scheduled coordinator (a function that
// counts the backlog every minute and invokes workers) adds a function, a
// schedule and a minute of delay before scaling, and still needs the
// workers to be ordinary claimers; the dispatch invocation that meets the
// backlog already has the count and its own measured rate, so it can size
// the fleet at once, with the same code path as every other claim. EventBridge
// Scheduler fan-out (several schedules, or one-off schedules created per
// worker) scales with the calendar, not the backlog: it would run the
// maximum fleet on an idle queue, or need an API call per worker to create
// and delete schedules. Self-invocation costs one async Invoke per worker,
// is bounded by reserved concurrency, and needs only lambda:InvokeFunction
// on the function's own ARN.
package fanout
