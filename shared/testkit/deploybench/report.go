package deploybench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

// Report is what one run measured.
type Report struct {
	Config Config
	// Schedule says how the schedule ran, its compression included.
	Schedule string
	Ticks    int
	// Elapsed runs from the start of the producers to the last invocation's
	// end.
	Elapsed     time.Duration
	Producers   workload.ProducerStats
	Measurement workload.Measurement
	Target      workload.TargetCounts
	// Dispatch is what the emulated Lambda service saw of the function;
	// Answers sums the invocations' answers.
	Dispatch lambdaemu.Stats
	Answers  Answers
	// Backlog is the drain of Config.Backlog (nil without one).
	Backlog *BacklogDrain
	// BacklogLoad is how long committing the backlog took (before the
	// schedule started; not part of any figure).
	BacklogLoad time.Duration
	// ClaimCalls counts outbox.claim_batch calls during the run.
	ClaimCalls int64
	// CPU is the CPU time spent from the schedule's start to the end of
	// the emulation, by whom.
	CPU workload.CPU
	// EndedByEmulator counts the invocations still lingering when
	// StopWhenDrained ended the run.
	EndedByEmulator int
	// ErrorLines are the first error lines the function printed.
	ErrorLines []string
	// CPUShare is the cap the emulator applied to each environment.
	CPUShare lambdaemu.CPUShareStatus
}

// BacklogDrain is how the backlog committed before the first tick went.
type BacklogDrain struct {
	workload.Measurement
	// ScheduleStart is when the schedule (and the offered load) started.
	ScheduleStart time.Time
}

// Took is from the schedule's start to the backlog's last receipt.
func (b BacklogDrain) Took() time.Duration {
	if b.Received == 0 {
		return 0
	}
	return b.LastReceipt.Sub(b.ScheduleStart)
}

// Rate is the backlog's messages received per second of Took.
func (b BacklogDrain) Rate() float64 {
	if took := b.Took(); took > 0 {
		return float64(b.Received) / took.Seconds()
	}
	return 0
}

// ClaimsPerSecond is ClaimCalls over Elapsed.
func (r Report) ClaimsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.ClaimCalls) / r.Elapsed.Seconds()
}

// LatencyWindows is the offered load's latency by when it was committed,
// in about twelve spans of whole seconds over the producers' run: where a
// tail came from (the first invocation's cold start, a stall), which the
// run's percentiles cannot say.
func (r Report) LatencyWindows() (time.Duration, []workload.Window) {
	width := max((r.Config.Duration / 12).Round(time.Second), time.Second)
	return width, r.Measurement.Windows(width)
}

// Print writes the report for a reader.
func (r Report) Print(w io.Writer) {
	c, m, d := r.Config, r.Measurement, r.Dispatch
	p := func(label, format string, args ...any) {
		fmt.Fprintf(w, "  %-12s %s\n", label, fmt.Sprintf(format, args...))
	}
	fmt.Fprintln(w, "The serverless deployment under the Lambda emulation (shared/testkit/lambdaemu):")
	p("schedule", "%s; %d ticks", r.Schedule, r.Ticks)
	reserved := "none"
	if c.ReservedConcurrency > 0 {
		reserved = fmt.Sprint(c.ReservedConcurrency)
	}
	p("function", "dispatch bootstrap, timeout %s (not compressed), %d MB, reserved concurrency %s; %s", c.Timeout, c.MemoryMB, reserved, r.CPUShare)
	p("settings", "%s", strings.Join(settings(c), " "))
	if c.Target == TargetEventBridge {
		conc := "the route's default"
		if c.RouteConcurrency > 0 {
			conc = fmt.Sprint(c.RouteConcurrency)
		}
		p("target", "EventBridge route (PutEvents of up to 10 entries, calls in flight: %s) to a local endpoint answering at once", conc)
	} else {
		p("target", "webhook answering %s after each call arrives, route concurrency %d", c.TargetLatency, c.RouteConcurrency)
	}
	p("offered", "%.0f msgs/s in transactions of %d for %s: %d committed (%.1f msgs/s), producer lag at most %s",
		c.Rate, c.MessagesPerTx, c.Duration, r.Producers.Messages, r.Producers.OfferedRate(), r.Producers.MaxLag.Round(time.Millisecond))
	p("delivered", "%d of %d (missing %d, unexpected %d), %.1f msgs/s from the first commit to the last receipt; target calls %d, duplicates %d, refused %d",
		m.Received, m.Committed, m.Missing, m.Unexpected, m.Throughput, r.Target.Calls, r.Target.Duplicates, r.Target.Refused)
	if b := r.Backlog; b != nil {
		how := "in transactions of 1,000"
		if c.BulkBacklog {
			how = "in bulk"
		}
		p("backlog", "%d of %d committed before the first tick (%s, in %s) received (missing %d) %s after the schedule started: %.0f msgs/s",
			b.Received, b.Committed, how, r.BacklogLoad.Round(time.Millisecond), b.Missing, b.Took().Round(time.Millisecond), b.Rate())
	}
	p("latency", "commit to receipt of the offered load: %s", m.Latency)
	tick := c.tick()
	p("", "within 100ms %.1f%%, 1s %.1f%%, one tick (%s) %.1f%%, two ticks %.1f%%",
		100*m.ShareWithin(100*time.Millisecond), 100*m.ShareWithin(time.Second), tick, 100*m.ShareWithin(tick), 100*m.ShareWithin(2*tick))
	if width, windows := r.LatencyWindows(); len(windows) > 1 {
		p("", "p99 by %s of commits: %s", width, workload.P99s(windows))
	}
	p("invocations", "%d: %s; cold starts %d (the slowest %s), environments started %d, max concurrency %d",
		d.Invocations, outcomes(d), d.ColdStarts, d.MaxInitDuration.Round(time.Millisecond), d.EnvironmentsStarted, d.MaxConcurrency)
	p("", "throttles %d sync / %d async, dropped events %d, retries %d, GB-seconds %.2f (billed %s)",
		d.SyncThrottles, d.AsyncThrottles, sum(d.Dropped), d.AsyncRetries, d.GBSeconds, d.BilledDuration.Round(time.Millisecond))
	p("answers", "%d batches, %d claimed, %d delivered, %d retried, %d dead; stopped by %s",
		r.Answers.Batches, r.Answers.Claimed, r.Answers.Delivered, r.Answers.Retried, r.Answers.Dead, counts(r.Answers.StoppedBy))
	p("elastic", "%d fan-out workers (started %d, throttled %d); lingered %s, woken %d times by NOTIFY, %d by polling",
		r.Answers.Workers, r.Answers.FanOutStarted, r.Answers.FanOutThrottled, r.Answers.Lingered.Round(time.Millisecond), r.Answers.NotifyWakeups, r.Answers.Polls)
	p("claims", "outbox.claim_batch called %d times in %s: %.2f a second", r.ClaimCalls, r.Elapsed.Round(time.Millisecond), r.ClaimsPerSecond())
	if r.EndedByEmulator > 0 {
		p("", "%d lingering invocation(s) ended by the emulator once drained (StopWhenDrained)", r.EndedByEmulator)
	}
	if u := r.CPU; u.Wall > 0 {
		db := "not readable (the server is not on this machine)"
		if u.DatabaseKnown {
			db = fmt.Sprintf("%.1f s (%.0f%%)", u.Database.Seconds(), 100*u.Busy(u.Database))
		}
		p("cpu", "in %s on %d cores: bootstraps %.1f s (%.0f%% of the cores), this process (target, producers, emulator) %.1f s (%.0f%%), the database's backends %s; the machine busy %.1f s (%.0f%%, other work included)",
			u.Wall.Round(time.Millisecond), u.Cores, u.Children.Seconds(), 100*u.Busy(u.Children), u.Self.Seconds(), 100*u.Busy(u.Self), db, u.Machine.Seconds(), 100*u.Busy(u.Machine))
	}
	for _, l := range r.ErrorLines {
		p("error line", "%s", l)
	}
}

// settings are the function's engine settings as the run set them.
func settings(c Config) []string {
	var out []string
	for _, kv := range append(TemplateEnv(c.Timeout), c.FunctionEnv...) {
		if strings.HasPrefix(kv, "OUTBOX_") {
			out = append(out, kv)
		}
	}
	return out
}

func outcomes(s lambdaemu.Stats) string {
	byOutcome := map[string]int{}
	for _, m := range s.Outcomes {
		for o, n := range m {
			byOutcome[string(o)] += n
		}
	}
	return counts(byOutcome)
}

func counts[K ~string](m map[K]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func sum[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
