// Package report turns a run's figures into the printed table, the goals
// with their ratios, docs/BENCHMARKS.md and its plot.
package report

import (
	"fmt"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/floor"
	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/suite"
)

// Goal is one target with its measured ratio.
type Goal struct {
	Name string
	// Measured explains the ratio's two sides.
	Measured string
	Ratio    float64
	// Target is the bound on Ratio; AtMost flips its direction.
	Target float64
	AtMost bool
	Known  bool
}

// Met says whether the goal was measured and reached.
func (g Goal) Met() bool {
	if !g.Known {
		return false
	}
	if g.AtMost {
		return g.Ratio <= g.Target
	}
	return g.Ratio >= g.Target
}

// RatioText is the ratio to two decimals, or three when two would round
// it onto the target and hide which side of it the ratio is on.
func (g Goal) RatioText() string {
	if two := fmt.Sprintf("%.2f", g.Ratio); two != fmt.Sprintf("%.2f", g.Target) || g.Ratio == g.Target {
		return two
	}
	return fmt.Sprintf("%.3f", g.Ratio)
}

// Verdict is "met", "NOT met" or "not measured".
func (g Goal) Verdict() string {
	switch {
	case !g.Known:
		return "not measured"
	case g.Met():
		return "met"
	default:
		return "NOT met"
	}
}

// Bound is the fixed-latency target's Little's-law bound in messages per
// second: at most Concurrency calls in flight, PerCall messages each, each
// call taking Latency: λ = L / W = Concurrency × PerCall / Latency.
func Bound(c suite.Config) float64 {
	return float64(c.Concurrency*c.PerCall) / c.Latency.Seconds()
}

// ShapePublish is the least time any publisher takes over a batch of
// c.ComparisonBatch: its calls run in whole rounds of Concurrency, so a
// batch takes ceil(calls / Concurrency) latencies.
func ShapePublish(c suite.Config) time.Duration {
	calls := (c.ComparisonBatch + c.PerCall - 1) / c.PerCall
	rounds := (calls + c.Concurrency - 1) / c.Concurrency
	return time.Duration(rounds) * c.Latency
}

// ShapeCeiling is the best rate any publisher reaches on batches of
// c.ComparisonBatch.
func ShapeCeiling(c suite.Config) float64 {
	return float64(c.ComparisonBatch) / ShapePublish(c).Seconds()
}

// BestGrid is the fastest engine configuration.
func BestGrid(r *suite.Results) (outboxrun.BurnDownResult, bool) {
	var best outboxrun.BurnDownResult
	for _, g := range r.Grid {
		if g.Rate() > best.Rate() || best.Messages == 0 {
			best = g
		}
	}
	return best, best.Messages > 0
}

// equalToRiver are the engine's runs on as many connections as River's
// pool: RiverDispatchers dispatchers of one connection each, and the same
// connections as the function uses them, dispatchers on pools of
// FunctionPool.
func equalToRiver(r *suite.Results) []outboxrun.BurnDownResult {
	var runs []outboxrun.BurnDownResult
	if e, ok := GridAt(r, r.Config.ComparisonBatch, suite.RiverDispatchers); ok {
		runs = append(runs, e)
	}
	if e := r.RiverPools; e.Messages > 0 {
		runs = append(runs, e)
	}
	return runs
}

// EqualToRiver is the faster of the engine's runs on as many connections as
// River's pool.
func EqualToRiver(r *suite.Results) (outboxrun.BurnDownResult, bool) {
	var best outboxrun.BurnDownResult
	for _, e := range equalToRiver(r) {
		if best.Messages == 0 || e.Rate() > best.Rate() {
			best = e
		}
	}
	return best, best.Messages > 0
}

// describeDispatchers names a run's dispatchers and their pools.
func describeDispatchers(e outboxrun.BurnDownResult) string {
	if e.Options.Conns > 1 {
		return fmt.Sprintf("%d dispatchers on pools of %d", e.Options.Dispatchers, e.Options.Conns)
	}
	return fmt.Sprintf("%d dispatchers", e.Options.Dispatchers)
}

// GridAt is the grid's run at one batch size and dispatcher count.
func GridAt(r *suite.Results, batch, dispatchers int) (outboxrun.BurnDownResult, bool) {
	for _, g := range r.Grid {
		if g.Options.BatchSize == batch && g.Options.Dispatchers == dispatchers {
			return g, true
		}
	}
	return outboxrun.BurnDownResult{}, false
}

// FloorAt is the floor's run with that many clients.
func FloorAt(r *suite.Results, clients int) (floor.Result, bool) {
	for _, f := range r.Floor {
		if f.Clients == clients {
			return f, true
		}
	}
	return floor.Result{}, false
}

// DefaultPaceAt is the engine's run beside the floor's with that many
// connections at the Go runtime's default collector pace (GOGC=100).
func DefaultPaceAt(r *suite.Results, dispatchers int) (outboxrun.BurnDownResult, bool) {
	for _, e := range r.FloorDefaultPace {
		if e.Options.Dispatchers == dispatchers {
			return e, true
		}
	}
	return outboxrun.BurnDownResult{}, false
}

// Goals evaluates the goals on r.
func Goals(r *suite.Results) []Goal {
	var goals []Goal
	g := Goal{Name: "burn-down through the engine ≥ 2.5× River's at equal connections", Target: 2.5}
	if e, ok := EqualToRiver(r); ok && r.River.Jobs > 0 {
		g.Known = true
		g.Ratio = e.Rate() / r.River.WorkRate()
		g.Measured = fmt.Sprintf("engine %s (batch %d, %s: as many connections as River's pool) / River %s",
			rate(e.Rate()), e.Options.BatchSize, describeDispatchers(e), rate(r.River.WorkRate()))
		for _, other := range equalToRiver(r) {
			if other.Options.Conns != e.Options.Conns {
				g.Measured += fmt.Sprintf("; %s: %.2f×", describeDispatchers(other), other.Rate()/r.River.WorkRate())
			}
		}
		if best, ok := BestGrid(r); ok && best.Rate() > e.Rate() {
			g.Measured += fmt.Sprintf("; the grid's best, batch %d × %d, is %.2f×", best.Options.BatchSize, best.Options.Dispatchers, best.Rate()/r.River.WorkRate())
		}
	}
	goals = append(goals, g)

	for _, c := range r.Config.FloorClients {
		g := Goal{Name: fmt.Sprintf("burn-down ≥ 0.9 of the SQL floor (%d connection(s))", c), Target: FloorTarget}
		e, eok := GridAt(r, r.Config.ComparisonBatch, c)
		f, fok := FloorAt(r, c)
		if eok && fok {
			g.Known = true
			g.Ratio = e.Rate() / f.Rate()
			g.Measured = fmt.Sprintf("engine %s (batch %d, %d dispatcher(s)) / floor %s (%d client(s)); at the p50 batch interval: %s / %s = %.2f",
				rate(e.Rate()), e.Options.BatchSize, c, rate(f.Rate()), c, rate(e.IntervalRate()), rate(f.IntervalRate()), e.IntervalRate()/f.IntervalRate())
			if d, ok := DefaultPaceAt(r, c); ok {
				g.Measured += fmt.Sprintf("; the collector at GOGC=%d, as the functions run it; at the runtime's default, GOGC=100: %s, %.2f", r.GCPercent, rate(d.Rate()), d.Rate()/f.Rate())
			}
		}
		goals = append(goals, g)
	}

	g = Goal{Name: fmt.Sprintf("with a %s target, ≥ 90%% of the Little's-law bound", human(r.Config.Latency)), Target: 0.90}
	if r.LatencyEngine.Messages > 0 {
		g.Known = true
		g.Ratio = r.LatencyEngine.Rate() / Bound(r.Config)
		g.Measured = fmt.Sprintf("engine %s / bound %s", rate(r.LatencyEngine.Rate()), rate(Bound(r.Config)))
	}
	goals = append(goals, g)

	for _, h := range []struct {
		run  outboxrun.BurnDownResult
		name string
	}{
		{r.HotKeyHTTP, fmt.Sprintf("one hot key to a webhook (%s per call, one message each) ≥ 0.90 of 1/latency", human(r.Config.Latency))},
		{r.HotKeySNS, fmt.Sprintf("one hot key to an SNS FIFO topic (%s per PublishBatch of 10) ≥ 0.90 of 10/latency", human(r.Config.Latency))},
	} {
		g := Goal{Name: h.name, Target: 0.90}
		if h.run.Messages > 0 {
			g.Known = true
			g.Ratio = h.run.Rate() / KeyBound(h.run)
			runs := max(splitKeyTime(h.run).runs, 1)
			g.Measured = fmt.Sprintf("engine %s / bound %s (%s messages on one key in %d runs, %.0f each on average: a lone key's runs grow from 100)",
				rateFine(h.run.Rate()), rate(KeyBound(h.run)), thousands(float64(h.run.Messages)), runs, float64(h.run.Messages)/float64(runs))
		}
		goals = append(goals, g)
	}

	g = Goal{Name: fmt.Sprintf("%s keys × %d messages ≥ 0.80 of the unordered burn-down", thousands(float64(r.Config.ManyKeys)), r.Config.PerKey), Target: 0.80}
	if k, u := r.ManyKeys, r.ManyKeysUnordered; k.Messages > 0 && u.Messages > 0 {
		g.Known = true
		g.Ratio = k.Rate() / u.Rate()
		g.Measured = fmt.Sprintf("engine %s with ordering keys / %s without (%s messages each, batch %d, 1 dispatcher); claim p50 %s / %s",
			rate(k.Rate()), rate(u.Rate()), thousands(float64(k.Messages)), k.Options.BatchSize, msec(k.ClaimLatency.P50), msec(u.ClaimLatency.P50))
	}
	goals = append(goals, g)

	g = Goal{Name: fmt.Sprintf("claim latency (p50) with %s queued behind a stuck key ≤ 1.2× without", count(r.Config.StuckDepth.Stuck)), Target: 1.2, AtMost: true}
	if stuck, base, ok := StuckPair(r); ok {
		g.Known = true
		g.Ratio = float64(stuck.Claim.P50) / float64(base.Claim.P50)
		g.Measured = fmt.Sprintf("%s / %s (ClaimBatch(%d) at %s unordered pending)", msec(stuck.Claim.P50), msec(base.Claim.P50), r.Config.ComparisonBatch, count(base.Pending))
	}
	goals = append(goals, g)

	lo, hi, ok := scalingEnds(r)
	for _, pct := range []string{"p50", "p99"} {
		g := Goal{Name: fmt.Sprintf("claim latency (%s) at %s pending ≤ 2× at %s pending", pct, count(hi.Pending), count(lo.Pending)), Target: 2, AtMost: true}
		if ok {
			a, b := lo.Claim.P50, hi.Claim.P50
			if pct == "p99" {
				a, b = lo.Claim.P99, hi.Claim.P99
			}
			g.Known = true
			g.Ratio = float64(b) / float64(a)
			g.Measured = fmt.Sprintf("%s / %s", msec(b), msec(a))
		}
		goals = append(goals, g)
	}

	g = Goal{Name: "enqueue inside a producer transaction adds ≤ 1 round trip", Target: 1, AtMost: true}
	if r.Producer.RoundTripsWith > 0 {
		g.Known = true
		g.Ratio = float64(r.Producer.AddedRoundTrips())
		g.Measured = fmt.Sprintf("%d round trips with the Enqueue − %d without", r.Producer.RoundTripsWith, r.Producer.RoundTripsWithout)
	}
	goals = append(goals, g)
	return append(goals, deploymentGoals(r)...)
}

// FloorTarget is the share of the bare-SQL floor the engine's burn-down is
// to reach.
const FloorTarget = 0.90

// KeyBound is a hot-key run's bound in messages per second: one call in
// flight (a key's messages go one call after another), PerCall messages
// each, each taking the target's latency.
func KeyBound(r outboxrun.BurnDownResult) float64 {
	t := r.Options.Target
	if t == nil || t.Latency <= 0 {
		return 0
	}
	return float64(t.PerCall) / t.Latency.Seconds()
}

// StuckPair is the claim scaling depth with a stuck key's backlog and its
// baseline: the same unordered depth with neither backlog nor archive.
func StuckPair(r *suite.Results) (stuck, base outboxrun.ClaimScalingResult, ok bool) {
	var sok, bok bool
	for _, s := range r.Scaling {
		if s.Stuck > 0 && !s.JITOff && !sok {
			stuck, sok = s, true
		}
	}
	for _, s := range r.Scaling {
		if sok && s.Stuck == 0 && s.Archive == 0 && s.Pending == stuck.Pending {
			base, bok = s, true
		}
	}
	return stuck, base, sok && bok
}

// StuckNoJIT is the stuck key's depth claimed with jit off.
func StuckNoJIT(r *suite.Results) (outboxrun.ClaimScalingResult, bool) {
	for _, s := range r.Scaling {
		if s.Stuck > 0 && s.JITOff {
			return s, true
		}
	}
	return outboxrun.ClaimScalingResult{}, false
}

// scalingEnds are the shallowest and deepest depths with neither an
// archive nor a stuck key.
func scalingEnds(r *suite.Results) (lo, hi outboxrun.ClaimScalingResult, ok bool) {
	for _, s := range r.Scaling {
		if s.Archive != 0 || s.Stuck != 0 {
			continue
		}
		if !ok || s.Pending < lo.Pending {
			lo = s
		}
		if !ok || s.Pending > hi.Pending {
			hi = s
		}
		ok = true
	}
	return lo, hi, ok && lo.Pending != hi.Pending
}

func rate(v float64) string { return fmt.Sprintf("%s msgs/s", thousands(v)) }

// rateFine is rate with a decimal below 1,000 msgs/s, where a whole number
// would hide a difference of a percent.
func rateFine(v float64) string {
	if v < 1000 {
		return fmt.Sprintf("%.1f msgs/s", v)
	}
	return rate(v)
}

func thousands(v float64) string {
	n := int64(v + 0.5)
	s := fmt.Sprint(n)
	out := ""
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out += ","
		}
		out += string(c)
	}
	return out
}

func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

func msec(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func mib(b int64) float64 { return float64(b) / (1 << 20) }
