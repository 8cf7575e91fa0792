package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/suite"
	"github.com/outboxkit/dispatcher/shared/testkit/deploybench"
	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

// The deployment's goals (issue 15).
const (
	// DeployP99 is the commit-to-receipt p99 the offered load must stay
	// within.
	DeployP99 = time.Second
	// DeployFloorTarget is the share of the 2-client floor the backlog
	// drain must reach.
	DeployFloorTarget = 0.80
	// DeployIdleClaims is the most claims a second an idle deployment may
	// make.
	DeployIdleClaims = 4.0
)

// ArmGBSecondPrice is Lambda's arm64 price per GB-second (us-east-1, the
// first tier, as the README states it), and RequestPrice per request.
const (
	ArmGBSecondPrice = 0.0000133334
	RequestPrice     = 0.20 / 1e6
)

// TicksPerMonth is a rate(1 minute) schedule's ticks in 30 days.
const TicksPerMonth = 30 * 24 * 60

// deploymentGoals are the deployment's three goals on r.
func deploymentGoals(r *suite.Results) []Goal {
	d := r.Deployment
	var goals []Goal

	g := Goal{Name: fmt.Sprintf("Lambda emulation: %s msgs/s offered to a %s webhook, commit-to-receipt p99 ≤ 1 s", thousands(d.Options.Rate), human(d.Options.Latency)),
		Target: 1, AtMost: true}
	if m := d.Latency.Measurement; m.Received > 0 {
		g.Known = true
		g.Ratio = m.Latency.P99.Seconds() / DeployP99.Seconds()
		g.Measured = fmt.Sprintf("p99 %s / 1 s (p50 %s, max %s; %s messages in %s, %s achieved by the producers; missing %d, duplicates %d)",
			msec(m.Latency.P99), msec(m.Latency.P50), msec(m.Latency.Max), thousands(float64(m.Committed)), human(d.Options.Duration),
			rateFine(d.Latency.Producers.OfferedRate()), m.Missing, d.Latency.Target.Duplicates)
		if width, windows := d.Latency.LatencyWindows(); len(windows) > 1 {
			g.Measured += fmt.Sprintf("; p99 by %s of commits: %s", human(width), workload.P99s(windows))
		}
	}
	goals = append(goals, g)

	b := d.Backlog.Backlog
	g = Goal{Name: fmt.Sprintf("Lambda emulation: a backlog of %s drains at ≥ 0.80 of the 2-client SQL floor", count(d.Options.Backlog)), Target: DeployFloorTarget}
	if f, ok := FloorAt(r, suite.DeployFloorClients); ok && b != nil && b.Received > 0 {
		g.Known = true
		g.Ratio = b.Rate() / f.Rate()
		g.Measured = fmt.Sprintf("drain %s (%s in %s, at most %s at once, DispatchMaxWorkers %d) / floor %s (%d clients, batch %d)",
			rate(b.Rate()), thousands(float64(b.Received)), human(b.Took().Round(100*time.Millisecond)), invocations(d.Backlog.Dispatch.MaxConcurrency),
			deploybench.TemplateMaxWorkers, rate(f.Rate()), f.Clients, f.BatchSize)
	}
	goals = append(goals, g)

	g = Goal{Name: "Lambda emulation: idle, ≤ 4 claims a second across all invocations", Target: DeployIdleClaims, AtMost: true}
	if i := d.Idle; i.Elapsed > 0 {
		g.Known = true
		g.Ratio = i.ClaimsPerSecond()
		g.Measured = fmt.Sprintf("%d claims in %s: %.2f a second; lingering costs %s GB-s a month (%s)",
			i.ClaimCalls, human(i.Elapsed.Round(100*time.Millisecond)), i.ClaimsPerSecond(), thousands(monthlyGBSeconds(i)), monthlyCost(i))
	}
	goals = append(goals, g)
	return goals
}

// monthlyGBSeconds is the idle run's billed GB-seconds per scheduled
// invocation, times a month of ticks: what lingering costs.
func monthlyGBSeconds(i deploybench.Report) float64 {
	if i.Ticks == 0 {
		return 0
	}
	return i.Dispatch.GBSeconds / float64(i.Ticks) * TicksPerMonth
}

func monthlyCost(i deploybench.Report) string {
	return fmt.Sprintf("$%.2f at the arm64 price, plus $%.2f of requests", monthlyGBSeconds(i)*ArmGBSecondPrice, TicksPerMonth*RequestPrice)
}

// writeDeployment is the section on the deployment under the emulation.
func writeDeployment(b *strings.Builder, r *suite.Results) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	d := r.Deployment
	o := d.Options
	p("## The deployment under the Lambda emulation\n\n")
	p("The dispatch function as deployed, not the engine alone: the real dispatch bootstrap (built with the deployment's flags) under `shared/testkit/lambdaemu`, driven by `shared/testkit/deploybench` (`make bench-deployment` runs the same driver by hand), with the template's defaults — schedule `rate(1 minute)` **in real time, not compressed**, the first tick at once; timeout %s; %d MB; linger and LISTEN on; `DispatchMaxWorkers` %d as reserved concurrency and `OUTBOX_MAX_WORKERS`; batches of %d, at most %d per run; a pool of %d connections. ",
		human(deploybench.TemplateTimeout), deploybench.TemplateMemoryMB, deploybench.TemplateMaxWorkers, deploybench.TemplateBatchSize, deploybench.TemplateMaxBatches, suite.FunctionPool)
	share := d.Latency.CPUShare
	if !share.Enabled {
		share = d.Backlog.CPUShare
	}
	capped := "**each execution environment ran at the CPU Lambda gives %d MB** (a cgroup v1 CPU group per environment; %s), so no bootstrap uses more CPU than it would deployed"
	if !share.Enabled {
		capped = "each execution environment was **not** capped at the CPU Lambda gives %d MB (%s)"
	}
	p("What is emulated: execution environments started cold, reused warm and frozen between invocations, asynchronous `Invoke` (fan-out) queued and run within the reserved concurrency, deadlines; "+capped+". What the machine is not: Lambda gives every invocation CPU of its own; here **every bootstrap, the target, the producers and PostgreSQL share the machine's %d cores** (with whatever else runs on it), and every call is on loopback. Each run had a fresh migrated database.\n\n", deploybench.TemplateMemoryMB, share, r.Env.Cores)
	p("| run | what | figures |\n|---|---|---|\n")
	if l := d.Latency; l.Elapsed > 0 {
		m := l.Measurement
		p("| latency | %s msgs/s offered for %s by producers committing %d messages a transaction, to a webhook answering after %s (64 calls in flight) | commit to receipt p50 %s, p90 %s, p99 %s, max %s; %s messages (%s achieved, producer lag at most %s), missing %d, duplicates %d; %s (%d fan-out workers), %.2f claims a second |\n",
			thousands(o.Rate), human(o.Duration), l.Config.MessagesPerTx, human(o.Latency), msec(m.Latency.P50), msec(m.Latency.P90), msec(m.Latency.P99), msec(m.Latency.Max),
			thousands(float64(m.Committed)), rateFine(l.Producers.OfferedRate()), l.Producers.MaxLag.Round(time.Millisecond), m.Missing, l.Target.Duplicates,
			invocations(l.Dispatch.Invocations), l.Answers.Workers, l.ClaimsPerSecond())
	}
	if i := d.Idle; i.Elapsed > 0 {
		p("| idle | no traffic for %s, then until the scheduled invocation returned by itself (%d tick(s)) | %d claims in %s: %.2f a second (%d woken by NOTIFY, %d safety polls); billed %s, %.1f GB-s for %d tick(s): **%s GB-s a month** at a tick a minute, %s |\n",
			human(o.Idle), i.Ticks, i.ClaimCalls, human(i.Elapsed.Round(100*time.Millisecond)), i.ClaimsPerSecond(), i.Answers.NotifyWakeups, i.Answers.Polls,
			human(i.Dispatch.BilledDuration.Round(100*time.Millisecond)), i.Dispatch.GBSeconds, i.Ticks, thousands(monthlyGBSeconds(i)), monthlyCost(i))
	}
	if bl := d.Backlog; bl.Backlog != nil {
		bd := bl.Backlog
		p("| backlog drain | %s messages (about 200 bytes of payload each; the floor's: %d) written with `INSERT ... SELECT` before the first tick (%s, then `VACUUM ANALYZE`; not timed), drained to an EventBridge route whose endpoint answers every `PutEvents` at once | %s in %s: **%s**; at most %s at once, %d fan-out workers, %d claims; missing %d, duplicates %d |\n",
			thousands(float64(o.Backlog)), r.Config.Spec.PayloadBytes, human(bl.BacklogLoad.Round(100*time.Millisecond)), thousands(float64(bd.Received)), human(bd.Took().Round(100*time.Millisecond)), rate(bd.Rate()),
			invocations(bl.Dispatch.MaxConcurrency), bl.Answers.Workers, bl.ClaimCalls, bd.Missing, bl.Target.Duplicates)
	}
	p("\n")
	p("The latency and backlog runs end once every message has arrived (and, for the backlog, the fan-out workers have returned): the scheduled invocations still lingering are then ended by the emulator rather than waited for until their deadline. The idle run waits for them: its claims and billed time are those of whole invocations, and the month's cost is its billed GB-seconds per tick times %s ticks (30 days), at $%.10f per GB-second (arm64, us-east-1, the first tier) — the README's arithmetic, 65 s of every minute at 256 MB, measured.\n\n", thousands(TicksPerMonth), ArmGBSecondPrice)
	p("**Why the drain goes to EventBridge.** The floor it is compared with delivers to nothing; a drain to the 20 ms webhook measures the route (64 calls in flight: at most 3,200 msgs/s per invocation, by Little's law), not the deployment. The EventBridge route carries 10 messages per call through the real SDK client (SigV4, the AWS JSON protocol) to a local endpoint (`AWS_ENDPOINT_URL_EVENTBRIDGE`, `shared/testkit/workload.EventBus`) that answers at once and reads each entry's message id from its payload without decoding the request; a webhook answering at once costs a signed HTTP call per message on both sides, ten times the calls on the same cores. Measured by hand when this section was written (`make bench-deployment`, 200,000 messages loaded in bulk, one invocation each): to the webhook answering at once (`-latency 1ns`) 7,060 msgs/s, the bootstrap spending 106 µs of CPU a message and the target 86 µs; to EventBridge 9,141–9,709 msgs/s, 51–55 µs and 16–17 µs.\n\n")
	writeDeploymentCPU(b, r)
}

// writeDeploymentCPU says where the drain's CPU went, against the floor's.
func writeDeploymentCPU(b *strings.Builder, r *suite.Results) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	bl := r.Deployment.Backlog
	if bl.Backlog == nil || bl.CPU.Wall <= 0 {
		return
	}
	u, n := bl.CPU, float64(bl.Backlog.Received)
	p("**Where the drain's CPU went** (from the kernel: the bootstraps' CPU time by `getrusage` once they ended, PostgreSQL's backends of the run's database from `/proc/<pid>/stat` every %s, the machine's from `/proc/stat`), over %s from the first tick to the end of the run, on %d cores (%s of CPU):\n\n",
		human(workload.DatabaseSampleEvery), human(u.Wall.Round(100*time.Millisecond)), u.Cores, human(time.Duration(float64(u.Wall)*float64(u.Cores)).Round(100*time.Millisecond)))
	p("| | CPU | of the cores | per message |\n|---|---:|---:|---:|\n")
	row := func(who string, t time.Duration) {
		p("| %s | %.1f s | %.0f%% | %.1f µs |\n", who, t.Seconds(), 100*u.Busy(t), t.Seconds()/n*1e6)
	}
	row("dispatch bootstraps", u.Children)
	if u.DatabaseKnown {
		row("PostgreSQL backends of the run's database", u.Database)
	}
	row("the benchmark process (the EventBridge endpoint, the emulator)", u.Self)
	row("the whole machine (other work included)", u.Machine)
	f := r.FloorCPU
	fl, ok := FloorAt(r, suite.DeployFloorClients)
	if ok && f.Wall > 0 && fl.Messages > 0 {
		fn := float64(fl.Messages)
		p("| *the 2-client floor, for comparison: PostgreSQL's backends* | %.1f s | %.0f%% | %.1f µs |\n", f.Database.Seconds(), 100*f.Busy(f.Database), f.Database.Seconds()/fn*1e6)
		p("| *the 2-client floor: its client (the benchmark process)* | %.1f s | %.0f%% | %.1f µs |\n", f.Self.Seconds(), 100*f.Busy(f.Self), f.Self.Seconds()/fn*1e6)
	}
	p("\n")
	if ok && f.Wall > 0 && u.DatabaseKnown && f.DatabaseKnown {
		fn := float64(fl.Messages)
		dbPer, floorPer := u.Database.Seconds()/n, f.Database.Seconds()/fn
		clientPer := (u.Children + u.Self).Seconds() / n
		floorClient := f.Self.Seconds() / fn
		p("Per message, the drain cost PostgreSQL %.1f µs against the floor's %.1f µs (×%.2f: batches of %d against %d, with the function's checks, fencing and archive, %s claiming side by side), and its own processes — bootstraps and endpoint — %.1f µs against the floor client's %.1f µs: %.0f%% of the drain's CPU was spent outside PostgreSQL, %.0f%% of the floor's. ",
			dbPer*1e6, floorPer*1e6, dbPer/floorPer, deploybench.TemplateBatchSize, fl.BatchSize, invocations(bl.Dispatch.MaxConcurrency), clientPer*1e6, floorClient*1e6,
			100*clientPer/(clientPer+dbPer), 100*floorClient/(floorClient+floorPer))
		p("At those costs the %d cores could carry at most %s for the drain, and %s for the floor. On Lambda each invocation runs on CPU of its own, and only PostgreSQL's share would be on the database's cores: at %.1f µs a message, %d cores of PostgreSQL alone would carry about %s.\n\n",
			u.Cores, rate(float64(u.Cores)/(dbPer+clientPer)), rate(float64(f.Cores)/(floorPer+floorClient)), dbPer*1e6, u.Cores, rate(float64(u.Cores)/dbPer))
	}
}

// writeDeploymentGap explains a deployment goal not met.
func writeDeploymentGap(b *strings.Builder, r *suite.Results, g Goal) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	switch {
	case strings.Contains(g.Name, "backlog"):
		p("The drain is CPU-bound on this machine, not bound by the database: see [where the drain's CPU went](#the-deployment-under-the-lambda-emulation). The floor is one process on the database's cores that sends two statements per batch and decodes nothing; the deployment adds, on the same two cores, up to %d bootstrap processes that decode every claimed row, route it, serialize, sign and send it to EventBridge and parse the answers, and the endpoint that receives them. ", deploybench.TemplateMaxWorkers)
		p("What would meet it is a machine shaped like the deployment: the bootstraps on CPU of their own, as Lambda runs them, and the database on its own server; the emulation cannot give that on one machine. What the product decides is measured here as it is: fan-out sizes the fleet by the first run's rate to drain within `OUTBOX_FANOUT_DRAIN_WITHIN` (30 s), assuming each worker adds what the first one measured alone — true on Lambda, not on shared cores — and the template's batch of %d costs the database more per message than the floor's %d. ", deploybench.TemplateBatchSize, r.Config.ComparisonBatch)
		p("A larger fleet does not help on these cores: by hand when this section was written, 1,000,000 messages with `OUTBOX_FANOUT_DRAIN_WITHIN=3s`, so that fan-out starts the %d invocations the template allows at once, drained at 11,358 msgs/s against 13,374 msgs/s with the default sizing (3 to 5 at once), PostgreSQL's backends spending 68 µs of CPU a message against 56 µs — more claimers on the same two cores cost more than they add. Nor did the batch or the pool: at 200,000, `OUTBOX_BATCH_SIZE=1000` drained at 10,159 msgs/s against 9,709 (one invocation each), `OUTBOX_DB_MAX_CONNS=1` at 10,157 (fan-out started a worker) against 9,141 on the default pool of 2 in the same hour (none started) — within the machine's noise.\n\n", deploybench.TemplateMaxWorkers)
	case strings.Contains(g.Name, "p99"):
		p("See the latency run's figures under [the deployment](#the-deployment-under-the-lambda-emulation), and the goal's p99 by span of commits: a tail in the first spans only is the first invocation's cold start under the CPU share, as the producers start with the schedule's first tick, and its catch-up; one spread over the run means messages waited for a tick instead of being woken by NOTIFY, or an invocation that cannot keep up.\n\n")
	default:
		p("See the idle run's figures under [the deployment](#the-deployment-under-the-lambda-emulation).\n\n")
	}
}

// deploymentRows are the printed table's rows of the deployment.
func deploymentRows(r *suite.Results, add func(figure, value, note string)) {
	d := r.Deployment
	if l := d.Latency; l.Elapsed > 0 {
		m := l.Measurement
		add(fmt.Sprintf("deployment (Lambda emulation): %s msgs/s to a %s webhook, commit to receipt", thousands(d.Options.Rate), human(d.Options.Latency)),
			fmt.Sprintf("p50 %s, p99 %s", msec(m.Latency.P50), msec(m.Latency.P99)),
			fmt.Sprintf("max %s; %d messages, missing %d; %s", msec(m.Latency.Max), m.Committed, m.Missing, invocations(l.Dispatch.Invocations)))
	}
	if i := d.Idle; i.Elapsed > 0 {
		add("deployment (Lambda emulation): idle", fmt.Sprintf("%.2f claims/s", i.ClaimsPerSecond()),
			fmt.Sprintf("%d claims in %s; %s GB-s a month (%s)", i.ClaimCalls, i.Elapsed.Round(100*time.Millisecond), thousands(monthlyGBSeconds(i)), monthlyCost(i)))
	}
	if bl := d.Backlog; bl.Backlog != nil {
		note := fmt.Sprintf("%d in %s, at most %s at once", bl.Backlog.Received, bl.Backlog.Took().Round(100*time.Millisecond), invocations(bl.Dispatch.MaxConcurrency))
		if f, ok := FloorAt(r, suite.DeployFloorClients); ok {
			note += fmt.Sprintf(", %.0f%% of the floor (%d clients)", 100*bl.Backlog.Rate()/f.Rate(), f.Clients)
		}
		if u := bl.CPU; u.Wall > 0 {
			note += fmt.Sprintf("; CPU: bootstraps %.1f s, PostgreSQL %.1f s, machine %.0f%% busy", u.Children.Seconds(), u.Database.Seconds(), 100*u.Busy(u.Machine))
		}
		add(fmt.Sprintf("deployment (Lambda emulation): backlog of %s to EventBridge", count(d.Options.Backlog)), rate(bl.Backlog.Rate()), note)
	}
}

func invocations(n int) string {
	if n == 1 {
		return "1 invocation"
	}
	return fmt.Sprintf("%d invocations", n)
}
