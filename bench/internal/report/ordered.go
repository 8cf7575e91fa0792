package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/suite"
)

// keyTime splits a hot-key run's wall time: the calls at the target's
// latency, what the calls took beyond it, and the time between the key's
// runs, when nothing of the key was in flight.
type keyTime struct {
	runs int
	// atLatency is the calls times the target's latency; beyond is the
	// rest of the time spent in Publish.
	atLatency, beyond time.Duration
	// between is the run's wall time outside Publish: the gaps between
	// runs, the first claim and the last completion.
	between time.Duration
	perCall time.Duration
	// late is the server's own time per call beyond the latency (its timer
	// firing late), when the server measures it; zero otherwise.
	late time.Duration
}

func splitKeyTime(h outboxrun.BurnDownResult) keyTime {
	t := keyTime{runs: h.Publishes, between: h.Elapsed - h.Publishing}
	if h.Options.Target != nil {
		t.atLatency = time.Duration(h.Calls) * h.Options.Target.Latency
	}
	t.beyond = h.Publishing - t.atLatency
	if h.Calls > 0 {
		t.perCall = h.Publishing / time.Duration(h.Calls)
		if h.Served > 0 && h.Options.Target != nil {
			t.late = h.Served/time.Duration(h.Calls) - h.Options.Target.Latency
		}
	}
	return t
}

// share is d's share of the run's wall time, in percent.
func share(d time.Duration, h outboxrun.BurnDownResult) float64 {
	return 100 * d.Seconds() / h.Elapsed.Seconds()
}

// writeOrdered is the section on ordering keys: two hot keys, many keys.
func writeOrdered(b *strings.Builder, r *suite.Results) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	cfg := r.Config
	p("## Ordered delivery\n\n")
	p("| scenario | messages | msgs/s | against | ratio | goal | claim p50 | complete p50 | between runs p50 | time per call |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|\n")
	hot := func(name string, h outboxrun.BurnDownResult, bound string) {
		if h.Messages == 0 {
			return
		}
		t := splitKeyTime(h)
		p("| %s | %s | %s | %s | %s | ≥ 0.90 | %s | %s | %s | %s |\n", name, thousands(float64(h.Messages)), fine(h.Rate()), bound,
			ratioText(h.Rate()/KeyBound(h), 0.90), msec(h.ClaimLatency.P50), msec(h.CompleteLatency.P50), msec(h.Gaps.P50), msec2(t.perCall))
	}
	hot(fmt.Sprintf("one key → webhook, %s per call", human(cfg.Latency)), r.HotKeyHTTP, fmt.Sprintf("the bound 1 / %s = %s", human(cfg.Latency), rate(KeyBound(r.HotKeyHTTP))))
	hot(fmt.Sprintf("one key → SNS FIFO topic, %s per PublishBatch", human(cfg.Latency)), r.HotKeySNS, fmt.Sprintf("the bound 10 / %s = %s", human(cfg.Latency), rate(KeyBound(r.HotKeySNS))))
	if k, u := r.ManyKeys, r.ManyKeysUnordered; k.Messages > 0 && u.Messages > 0 {
		p("| %s keys × %d messages, interleaved → no-op | %s | %s | unordered, same messages: %s | %s | ≥ 0.80 | %s | %s | – | – |\n",
			thousands(float64(cfg.ManyKeys)), cfg.PerKey, thousands(float64(k.Messages)), thousands(k.Rate()), rate(u.Rate()), ratioText(k.Rate()/u.Rate(), 0.80), msec(k.ClaimLatency.P50), msec(k.CompleteLatency.P50))
		p("| the same without ordering keys → no-op | %s | %s | | | | %s | %s | – | – |\n", thousands(float64(u.Messages)), thousands(u.Rate()), msec(u.ClaimLatency.P50), msec(u.CompleteLatency.P50))
	}
	p("\nA key's messages go out one call at a time, each after the previous one was accepted, and its next run can be claimed only once this one is recorded (one claim in flight per key); so one key has at most one call in flight, and by Little's law (L = λW with L = B messages in flight) it cannot beat B / W: 1 / %s = %s to a target taking one message per call, 10 / %s = %s to an SNS FIFO topic in `PublishBatch` calls of 10. \"Between runs\" is the time from the end of one run's publishing to the start of the next one's: the run's completion, then the claim of the key's next run, one after the other. \"Time per call\" is the time spent publishing over the calls the target answered.\n\n",
		human(cfg.Latency), rate(1/cfg.Latency.Seconds()), human(cfg.Latency), rate(10/cfg.Latency.Seconds()))
	p("How each was measured, and what makes it fair:\n\n")
	p("- **One hot key** (`dispatch.Engine`, `OrderedRun` at its default of %d, which a key alone in the queue outgrows: its run doubles, up to the batch, while a run publishes in under a second): the messages are enqueued with `outbox.EnqueueBatch` on one ordering key (batches of 1,000, a dedupe key each, the same %d-byte payload) into a template database; each run drains a fresh copy, after the same `VACUUM ANALYZE` as every burn-down, with one dispatcher at batch %d on one connection, the configuration the floor comparison uses. The publishers are the product's own, built by `shared/publish/publishers.Build` from a route table as the dispatch function's cold start builds them: the webhook publisher (Standard Webhooks signing, its keep-alive HTTP client) posting to a local `net/http` server that answers 204 %s after each request arrives; the SNS publisher, through the AWS SDK client `sns.NewClient` builds (the publisher's own `PublishBatch` serializer, the SDK's SigV4 signer, retryer and deserializer), to a FIFO topic on the project's wire-level fake (`shared/testkit/awsfake/snsfake`, `SetLatency(%s)`: %s from a request's arrival to its answer). Both servers run on this machine, so the calls' own CPU competes with PostgreSQL for the two cores, as it would not against the real services. The webhook server's latency is a `time.Sleep`, which wakes up to a millisecond late (the runtime's timers wake through `epoll_wait`, which counts whole milliseconds); the SNS fake sleeps the last 2 ms of its latency with `nanosleep(2)` (`shared/testkit/awsfake/faults`), so that it answers close to its latency. Each server measures its own time, from a request's arrival to its answer, and the figures below give its share. The clock runs from the first claim to the last completion, so the first call's connection set-up is in it (under 0.1%% of a run). ",
		outboxDefaultRun(r), cfg.Spec.PayloadBytes, cfg.ComparisonBatch, human(cfg.Latency), human(cfg.Latency), human(cfg.Latency))
	if h := r.HotKeyHTTP; h.Messages > 0 {
		p("The webhook run drains %s messages once: at 50 msgs/s the 5,000 of the goal's wording would take 100 s, and the figure it tests — what the %d gaps between runs add to %s of calls — is the same per run. ", thousands(float64(h.Messages)), h.Publishes-1, human(splitKeyTime(h).atLatency))
	}
	if h := r.HotKeySNS; h.Messages > 0 {
		p("The SNS run drains %s messages, %d times, and keeps the fastest run.", thousands(float64(h.Messages)), suite.Repeats)
	}
	p("\n")
	p("- **Many keys**: %s keys of %d messages, message i on key i mod %s, enqueued in that order (as the producers of that many keys write them, each key's messages spread over the whole queue) with `EnqueueBatch` of 1,000 and dedupe keys; the baseline is as many messages with the same payload and dedupe keys and no ordering key. Both drain fresh copies of their templates with the no-op publisher, one dispatcher at batch %d on one connection, in adjacent pairs (baseline first), %d times, each keeping its fastest run. A claim of %d then takes %d keys' whole runs (a head and the %d messages behind it).\n",
		thousands(float64(cfg.ManyKeys)), cfg.PerKey, thousands(float64(cfg.ManyKeys)), cfg.ComparisonBatch, suite.Repeats, cfg.ComparisonBatch, cfg.ComparisonBatch/max(cfg.PerKey, 1), cfg.PerKey-1)
	p("- **A stuck key** is in the [claim scaling table](#scaling): the claims of unordered messages with a key's backlog in the same table, against the same claims without it, their cycles interleaved.\n\n")

	for _, h := range []struct {
		name string
		run  outboxrun.BurnDownResult
	}{{"webhook", r.HotKeyHTTP}, {"SNS FIFO", r.HotKeySNS}} {
		if h.run.Messages == 0 {
			continue
		}
		t := splitKeyTime(h.run)
		p("Where the %s run's %s went: %.1f%% in calls at the target's %s, %.1f%% in the calls beyond it (%s per call on average",
			h.name, human(h.run.Elapsed.Round(time.Millisecond)), share(t.atLatency, h.run), human(cfg.Latency), share(t.beyond, h.run), msec2(t.perCall-h.run.Options.Target.Latency))
		if t.late > 0 {
			p(": %s of it the server's own time past the latency (its timer waking late, its answer), as it measured itself, %s the client's work and the loopback round trip", msec2(t.late), msec2(t.perCall-h.run.Options.Target.Latency-t.late))
		} else {
			p(": the SDK's serializer and signer, the fake's answer, and the fake's timer waking late as the webhook server's did")
		}
		p("), %.1f%% between runs (%d runs, %.0f messages each on average; %s each at p50, %s at p99). ", share(t.between, h.run), t.runs, float64(h.run.Messages)/float64(max(t.runs, 1)), msec(h.run.Gaps.P50), msec(h.run.Gaps.P99))
	}
	p("\n\n")
}

// writeHotKeyGap explains a hot-key goal not met.
func writeHotKeyGap(b *strings.Builder, r *suite.Results, h outboxrun.BurnDownResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	t := splitKeyTime(h)
	bound := KeyBound(h)
	lat := h.Options.Target.Latency
	p("The run took %s for %s messages, %s at the bound. The rest is in two places: **between runs**, %s (%.1f%% of the run): %d gaps of p50 %s, each the run's completion (p50 %s) and then the claim of the key's next run (p50 %s), one after the other — the next run is not claimable before this one is recorded; and **in the calls beyond the target's %s**, %s (%.1f%%, %s per call): ",
		human(h.Elapsed.Round(time.Millisecond)), thousands(float64(h.Messages)), human(time.Duration(float64(h.Messages)/bound*float64(time.Second)).Round(time.Millisecond)),
		human(t.between.Round(time.Millisecond)), share(t.between, h), t.runs-1, msec(h.Gaps.P50), msec(h.CompleteLatency.P50), msec(h.ClaimLatency.P50),
		human(lat), human(t.beyond.Round(time.Millisecond)), share(t.beyond, h), msec2(t.perCall-lat))
	if t.late > 0 {
		p("%s of it the server's own time past the latency (its timer waking late, its answer), as it measured itself; the rest, %s, the client's: our encoding and serializer, the AWS SDK's middleware, SigV4 signer and XML deserializer, the loopback round trip and the hand-offs between goroutines, on two cores shared with PostgreSQL and whatever else runs on the machine. `BenchmarkPublishOrderedRun` (`shared/publish/sns`) publishes one key's run to the fake answering at once: when this section was written a call of 10 (a 27 KB form body for 10 messages of 512 bytes with their attributes) took 1.1 ms there on a loaded machine, of which, in CPU, the SDK's XML deserializer 0.11 ms, the signer 0.05 ms, the request's serializer 0.06 ms (the publisher's own since `NewClient` installs it; the SDK's, which builds a map of every form field, sorts it and escapes it into a growing buffer, took 0.40 ms and the call 1.44 ms), our encoding 0.02 ms, and the fake 0.21 ms, most of it inside the latency. With the fake at 20 ms, each call took 1.2 ms beyond it there, against 2.0 ms before the publisher's serializer and the fake's precise sleep (1.7 ms with either alone; alternated runs of each build). ", msec2(t.late), msec2(t.perCall-lat-t.late))
	} else {
		p("the client's own work — the SDK's query serializer and SigV4 signer, the answer's parsing: 0.93 ms per call of 10 at zero latency, publishing straight to the fake on this machine when this section was written — and the fake's Go timer waking late")
		if w := splitKeyTime(r.HotKeyHTTP); w.late > 0 {
			p(" (the webhook server, on the same kind of timer, measured %s per call in this run)", msec2(w.late))
		}
		p(", on two cores shared with PostgreSQL and whatever else runs on the machine. ")
	}
	// What the run would have reached with runs of n messages and each
	// gap scaled by f, the calls as they were.
	perMsg := h.Publishing.Seconds() / float64(h.Messages)
	gap := t.between.Seconds() / float64(max(t.runs, 1))
	at := func(n int, f float64) float64 { return 1 / (perMsg + f*gap/float64(n)) / bound }
	run := h.Messages / max(t.runs, 1)
	p("With the calls as they were, the run would have reached **%.3f** of the bound without any gap: the calls' own time is the larger part, and it leaves the gaps %.1f%% of the run to stay within the goal. At this run's figures, each gap halved (one round trip instead of two) gives %.3f.\n\n",
		at(run, 0), 100*(1-0.90/at(run, 0)), at(run, 0.5))
	p("The runs were longer than `OrderedRun` because the key was alone: the engine doubles a lone key's run while a run publishes in under a second, up to the batch (`pipeline.adaptRun` in `shared/dispatch`), and goes back to `OrderedRun` as soon as a batch holds anything else. Longer runs for every key would cost several hot keys much more, as measured with `go run ./cmd/hotkey` (in `bench/`) when this section was written: a run longer than a key's share of a batch takes the other keys' parallelism, since a batch is published whole before the next one; with `-keys 5 -messages 10000 -batch 500 -ordered-run 100,500` (five hot keys, the dispatch function's default batch) runs of 100 drained about 1,930 msgs/s and runs of 500, one key per claim, about 470 msgs/s. The gap grows with the run, but less than the run does: with `-ordered-run 100,500,1000 -rounds 2` its p50 was about 11, 33 and 52 ms, its share of the run 5.5%%, 3.3%% and 2.8%%.\n\n")
	p("The gaps are not JIT compilation: `claim_batch` and `complete_batch` run with `jit = off`, and on one key of 5,000 their statements' estimated costs stay below `jit_above_cost` anyway (a hot key's claim and completion took the same p50 with the session's `jit` on and off, when this section was written).\n\n")
	p("What would take the rest, in the product (not changed here), each taking a part of the gap or of the calls' own time:\n\n")
	p("1. **Hand out the key's next run in the completion.** `complete_batch` already settles each key whose message left (it makes the next message the head, under the key's lock); if, for a run delivered whole, it also leased the key's next run to the same worker and returned it, the gap would be one round trip and one commit instead of two. The engine would publish the returned run at once instead of claiming.\n")
	p("2. **Record a run's delivered part while its last calls are in flight.** A run of %d to this target is %d calls one after another; completing what the first calls delivered while the last ones go out would leave only the tail's completion in the gap. Publish would have to report each call's results as they come, not the batch's at the end.\n",
		run, run/max(h.Options.Target.PerCall, 1))
	p("3. **Prepare a key's next call while the current one is in flight.** The `Batcher` packs a key's next call only once the current one is answered, then the publisher encodes it, the SDK builds, serializes and signs it: all in the call's path. Packing it ahead and holding it, serialized and signed, until the answer says the key may go on (or dropping it, released, if it may not) would leave only the send and the answer's parsing there.\n")
	p("\n")
}

// writeManyKeysGap explains the many-keys goal not met: what the claim and
// the completion of keyed messages do beyond the unordered ones.
func writeManyKeysGap(b *strings.Builder, r *suite.Results) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	k, u := r.ManyKeys, r.ManyKeysUnordered
	cfg := r.Config
	perKey := max(cfg.PerKey, 1)
	runs := cfg.ComparisonBatch / perKey
	heads := min(cfg.ComparisonBatch, cfg.ManyKeys)
	p("With keys the claim's p50 is %s against %s (%.2f×) and the completion's %s against %s (%.2f×; it also settles the %d keys whose runs left, making no new heads); the claims took %.0f%% of the dispatcher's wall time (%s of %s) against %.0f%% without, the completions %.0f%% against %.0f%%.\n\n",
		msec(k.ClaimLatency.P50), msec(u.ClaimLatency.P50), float64(k.ClaimLatency.P50)/float64(u.ClaimLatency.P50),
		msec(k.CompleteLatency.P50), msec(u.CompleteLatency.P50), float64(k.CompleteLatency.P50)/float64(u.CompleteLatency.P50), runs,
		100*k.Claim.Seconds()/k.Elapsed.Seconds(), human(k.Claim.Round(time.Millisecond)), human(k.Elapsed.Round(time.Millisecond)), 100*u.Claim.Seconds()/u.Elapsed.Seconds(),
		100*k.Complete.Seconds()/k.Elapsed.Seconds(), 100*u.Complete.Seconds()/u.Elapsed.Seconds())
	p("The claim writes one row per run: when the first claimable head has a run behind it, it reads the heads one by one, each locked and followed at once by its run, until the batch is full — %d heads leased, each recording its run's extent (`run_through`), and %s followers read, not written; the %s heads behind the batch's last run are neither read nor locked (`TestClaimOfManyKeysReadsOnlyTheRunsItTakes`, `TestAClaimOfRunsWritesOnlyTheirHeads`). ",
		runs, thousands(float64(runs*(perKey-1))), thousands(float64(heads-runs)))
	p("What the keyed drain still does beyond the unordered one: **its rows are spread over the table** (message i on key i mod 2,000), so a batch's completion deletes rows on about 1,000 heap pages where an unordered batch touches a few dozen (2–3 ms more per batch of 1,000, measured on a copy with each key's messages written together, when this was measured); each follower's outcome is fenced by one probe of `pending_key_head` for its run's head (about 1 µs each); and the completion **settles the %d keys whose runs left** under their keys' locks (`settle_keys`, 2.5–2.9 ms a batch). Where the rest went in this run is in the claim and completion figures above; a run of `go run ./cmd/manykeys` (in `bench/`) repeats this scenario alone.\n\n",
		runs)
}

// writeStuckGap explains the stuck-key goal not met.
func writeStuckGap(b *strings.Builder, r *suite.Results) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	stuck, base, _ := StuckPair(r)
	p("The backlog is not in `pending_claimable` (`behind = true`) and its head is at the index's far end (due in a year), so the claim's index scan reads neither (`TestStuckKeyCostsTheClaimNothing` counts its index reads). ")
	if nj, ok := StuckNoJIT(r); ok {
		p("The same claims from the same queue on a session with `jit = off` took p50 %s (×%.2f the baseline's %s); with the server's default, %s. ",
			msec(nj.Claim.P50), float64(nj.Claim.P50)/float64(base.Claim.P50), msec(base.Claim.P50), msec(stuck.Claim.P50))
	}
	p("What the backlog used to change was the plan's estimated cost, and with it JIT compilation: the planner estimates the runs behind the heads from the table's statistics, and with one key holding most of the rows its estimate crossed `jit_above_cost`, so that every claim compiled its statements (×2.7 the baseline's p50). `claim_batch` now runs with `jit = off` (and `complete_batch` and the reaper's functions with it; `TestDispatcherCallsNeverJITCompile`), so the server's default and the session's `jit = off` measure the same function: a difference between them, or with the baseline, is not the backlog's unless it repeats across runs.\n\n")
}

// outboxDefaultRun is the run length the hot-key runs used.
func outboxDefaultRun(r *suite.Results) int {
	for _, h := range []outboxrun.BurnDownResult{r.HotKeyHTTP, r.HotKeySNS} {
		if h.Options.FullBatch > 0 {
			return h.Options.FullBatch
		}
	}
	return 100
}

// ratioText is a ratio as Goal.RatioText shows it.
func ratioText(ratio, target float64) string {
	return Goal{Ratio: ratio, Target: target}.RatioText()
}

// fine is a rate with a decimal below 1,000.
func fine(v float64) string {
	if v < 1000 {
		return fmt.Sprintf("%.1f", v)
	}
	return thousands(v)
}

// msec2 is a duration in milliseconds with two decimals.
func msec2(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// joinAnd joins phrases as "a, b and c".
func joinAnd(parts []string) string {
	switch len(parts) {
	case 0:
		return ""
	case 1:
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}
