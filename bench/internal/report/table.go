package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/callcost"
	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/suite"
)

// row is one line of the printed table.
type row struct{ figure, value, note string }

// rows are every figure of r, in the table's order.
func rows(r *suite.Results) []row {
	var out []row
	add := func(figure, value, note string) { out = append(out, row{figure, value, note}) }
	cfg := r.Config
	if r.EnqueueDedupe.Messages > 0 {
		add("outbox enqueue: EnqueueBatch of 1000, dedupe keys", rate(r.EnqueueDedupe.Rate()), "one connection")
	}
	if r.EnqueuePlain.Messages > 0 {
		add("outbox enqueue: EnqueueBatch of 1000, no dedupe keys", rate(r.EnqueuePlain.Rate()), "one connection")
	}
	if e := r.EnqueueKeyed; e.Messages > 0 {
		add(fmt.Sprintf("outbox enqueue: EnqueueBatch of 1000, dedupe keys, %d ordering keys", cfg.ManyKeys), rate(e.Rate()), fmt.Sprintf("one connection, %d messages", e.Messages))
	}
	if r.River.Jobs > 0 {
		add("River insert: InsertManyFast of 1000", rate(r.River.InsertRate()), "one connection")
	}
	if r.Watermill.Messages > 0 {
		add("watermill-sql publish: Publish of 1000", rate(r.Watermill.PublishRate()), "one connection")
	}
	for _, f := range r.Floor {
		add(fmt.Sprintf("SQL floor burn-down: batch %d, %d client(s)", f.BatchSize, f.Clients), rate(f.Rate()),
			fmt.Sprintf("claim p50 %s, complete p50 %s", msec(f.ClaimLatency.P50), msec(f.CompleteLatency.P50)))
	}
	if len(r.CallCost) > 0 {
		s := func(f func(callcost.Round) float64) callcost.Spread { return callcost.Summarise(r.CallCost, f) }
		both := s(callcost.Round.Ratio)
		add("PostgreSQL CPU per message, engine ÷ floor (their calls in turn on one connection)", fmt.Sprintf("%.3f", both.Median),
			fmt.Sprintf("median of %d rounds (%.3f–%.3f); claim %.3f, complete %.3f", len(r.CallCost), both.Min, both.Max,
				s(callcost.Round.ClaimRatio).Median, s(callcost.Round.CompleteRatio).Median))
	}
	for _, g := range r.Grid {
		var notes []string
		if r.River.Jobs > 0 {
			notes = append(notes, fmt.Sprintf("%.2f× River", g.Rate()/r.River.WorkRate()))
		}
		if f, ok := FloorAt(r, g.Options.Dispatchers); ok && g.Options.BatchSize == f.BatchSize {
			notes = append(notes, fmt.Sprintf("%.0f%% of floor (%d client(s))", 100*g.Rate()/f.Rate(), f.Clients))
		}
		add(fmt.Sprintf("engine burn-down: batch %d, %d dispatcher(s)", g.Options.BatchSize, g.Options.Dispatchers), rate(g.Rate()), strings.Join(notes, ", "))
	}
	if d := r.DefaultPool; d.Messages > 0 {
		note := "the dispatch function's default pool"
		if f, ok := FloorAt(r, d.Options.Conns); ok && f.BatchSize == d.Options.BatchSize {
			note += fmt.Sprintf(", %.0f%% of floor (%d clients)", 100*d.Rate()/f.Rate(), f.Clients)
		}
		add(fmt.Sprintf("engine burn-down: batch %d, 1 dispatcher on a pool of %d", d.Options.BatchSize, d.Options.Conns), rate(d.Rate()), note)
	}
	if d := r.RiverPools; d.Messages > 0 {
		note := "as many connections as River's pool"
		if r.River.Jobs > 0 {
			note += fmt.Sprintf(", %.2f× River", d.Rate()/r.River.WorkRate())
		}
		add(fmt.Sprintf("engine burn-down: batch %d, %d dispatchers on pools of %d", d.Options.BatchSize, d.Options.Dispatchers, d.Options.Conns), rate(d.Rate()), note)
	}
	if r.River.Jobs > 0 {
		add(fmt.Sprintf("River work: %d no-op workers", 2000), rate(r.River.WorkRate()), "")
	}
	if w := r.Watermill; w.Messages > 0 {
		note := ""
		if w.Stalls > 0 {
			note = fmt.Sprintf("stalled %s waiting for other transactions on the server; %s without the stalls", w.Stalled.Round(time.Millisecond), rate(w.ActiveRate()))
		}
		if w.Consumed < w.Messages {
			note = fmt.Sprintf("gave up after %d of %d messages; ", w.Consumed, w.Messages) + note
		}
		add(fmt.Sprintf("watermill-sql consume: batches of %d, acked", w.SubscribeBatchSize), rate(w.ConsumeRate()), note)
	}
	if r.LatencyEngine.Messages > 0 {
		add(fmt.Sprintf("engine (pipelined), %s target (%d/call, %d at once), batch %d", human(cfg.Latency), cfg.PerCall, cfg.Concurrency, cfg.ComparisonBatch),
			rate(r.LatencyEngine.Rate()), fmt.Sprintf("%.0f%% of the bound %s", 100*r.LatencyEngine.Rate()/Bound(cfg), rate(Bound(cfg))))
	}
	for _, h := range []struct {
		name string
		run  outboxrun.BurnDownResult
	}{{"webhook", r.HotKeyHTTP}, {"SNS FIFO", r.HotKeySNS}} {
		if h.run.Messages == 0 {
			continue
		}
		t := splitKeyTime(h.run)
		add(fmt.Sprintf("engine, one hot key → %s, %s per call, %d messages", h.name, human(cfg.Latency), h.run.Messages), rateFine(h.run.Rate()),
			fmt.Sprintf("%.1f%% of the bound %s; %d calls, %s per call; between runs p50 %s (claim p50 %s, complete p50 %s), %.1f%% of the time",
				100*h.run.Rate()/KeyBound(h.run), rate(KeyBound(h.run)), h.run.Calls, msec2(t.perCall), msec(h.run.Gaps.P50),
				msec(h.run.ClaimLatency.P50), msec(h.run.CompleteLatency.P50), share(t.between, h.run)))
	}
	if k, u := r.ManyKeys, r.ManyKeysUnordered; k.Messages > 0 && u.Messages > 0 {
		add(fmt.Sprintf("engine burn-down: %d keys × %d messages, batch %d, 1 dispatcher", cfg.ManyKeys, cfg.PerKey, k.Options.BatchSize), rate(k.Rate()),
			fmt.Sprintf("%.0f%% of unordered; claim p50 %s, complete p50 %s", 100*k.Rate()/u.Rate(), msec(k.ClaimLatency.P50), msec(k.CompleteLatency.P50)))
		add(fmt.Sprintf("engine burn-down: the same %d messages unordered", u.Messages), rate(u.Rate()),
			fmt.Sprintf("claim p50 %s, complete p50 %s", msec(u.ClaimLatency.P50), msec(u.CompleteLatency.P50)))
	}
	for _, s := range r.Scaling {
		name := fmt.Sprintf("ClaimBatch(%d) at %s pending", cfg.ComparisonBatch, count(s.Pending))
		if s.Archive > 0 {
			name += fmt.Sprintf(", %s archived attempts", count(s.Archive))
		}
		if s.Stuck > 0 {
			name += fmt.Sprintf(", %s behind a stuck key", count(s.Stuck))
		}
		if s.JITOff {
			name += " (session jit = off)"
		}
		add(name, fmt.Sprintf("p50 %s, p99 %s", msec(s.Claim.P50), msec(s.Claim.P99)),
			fmt.Sprintf("CompleteBatch p50 %s, p99 %s", msec(s.Complete.P50), msec(s.Complete.P99)))
	}
	if p := r.Producer; p.RoundTripsWith > 0 {
		add("producer transaction without Enqueue", fmt.Sprintf("p50 %s, p99 %s", msec(p.Without.P50), msec(p.Without.P99)), fmt.Sprintf("%d round trips", p.RoundTripsWithout))
		add("producer transaction with one Enqueue", fmt.Sprintf("p50 %s, p99 %s", msec(p.With.P50), msec(p.With.P99)),
			fmt.Sprintf("%d round trips (%d on a connection's first use)", p.RoundTripsWith, p.RoundTripsFirstUse))
		add("  added by the Enqueue", fmt.Sprintf("p50 %+.2f ms, p99 %+.2f ms", ms(p.AddedP50()), ms(p.AddedP99())), fmt.Sprintf("%+d round trip(s)", p.AddedRoundTrips()))
	}
	if m := r.Memory; m.PeakHWM > 0 {
		add(fmt.Sprintf("dispatch bootstrap, one invocation of %d messages", m.Messages), fmt.Sprintf("VmHWM %.1f MiB", mib(m.PeakHWM)),
			fmt.Sprintf("%.1f MiB after the cold start; %d PutEvents calls", mib(m.ColdHWM), m.PutEventsCalls))
	}
	deploymentRows(r, add)
	for _, g := range Goals(r) {
		v := "-"
		if g.Known {
			v = g.RatioText()
		}
		bound := "≥"
		if g.AtMost {
			bound = "≤"
		}
		add("GOAL "+g.Name, v, fmt.Sprintf("%s (%s %.2f) %s", g.Verdict(), bound, g.Target, g.Measured))
	}
	for phase, err := range r.Failures {
		add("FAILED "+phase, "-", oneLine(err))
	}
	return out
}

// Table prints every figure as one table.
func Table(w io.Writer, r *suite.Results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "figure\tvalue\tnotes\n")
	fmt.Fprintf(tw, "------\t-----\t-----\n")
	for _, x := range rows(r) {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", x.figure, x.value, x.note)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d messages of %d bytes per system; run took %s\n", r.Config.Spec.Messages, r.Config.Spec.PayloadBytes, r.Elapsed.Round(1e9))
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
