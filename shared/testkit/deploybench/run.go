package deploybench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

// dispatchFunction is the emulated function's name.
const dispatchFunction = "outbox-dispatch"

// Run runs the deployment under the offered load and reports what it
// measured.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	if cfg.Drain == 0 {
		cfg.Drain = 3*cfg.tick() + cfg.Timeout + time.Duration(cfg.Backlog)*time.Millisecond
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	rep := Report{Config: cfg}

	admin, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return rep, fmt.Errorf("deploybench: connect: %w", err)
	}
	defer admin.Close()
	var database string
	if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		return rep, fmt.Errorf("deploybench: connect: %w", err)
	}
	if err := workload.EnableFunctionStats(ctx, admin, database); err != nil {
		return rep, err
	}
	claimsBefore, err := workload.ClaimCalls(ctx, admin)
	if err != nil {
		return rep, err
	}

	target, env, err := startTarget(cfg)
	if err != nil {
		return rep, err
	}
	defer target.Close()

	errorLines := &lineSample{max: 5}
	emu, err := lambdaemu.New(lambdaemu.Options{
		DiscardLogs: true,
		CPU:         cfg.CPU,
		OnLog: func(_ string, l lambdaemu.LogLine) {
			if strings.Contains(l.Text, `"level":"ERROR"`) || l.Stream == "stderr" {
				errorLines.add(l.Text)
			}
		},
	})
	if err != nil {
		return rep, err
	}
	defer emu.Close()
	rep.CPUShare = emu.CPUShareStatus()
	async := cfg.Async
	if err := emu.Register(lambdaemu.FunctionConfig{
		Name: dispatchFunction, Binary: cfg.DispatchBinary, Timeout: cfg.Timeout, MemoryMB: cfg.MemoryMB,
		ReservedConcurrency: cfg.ReservedConcurrency, Async: async, Env: append(functionEnv(cfg, env), cfg.FunctionEnv...),
	}); err != nil {
		return rep, err
	}

	producers, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return rep, fmt.Errorf("deploybench: connect the producers: %w", err)
	}
	defer producers.Close()

	backlog := workload.NewLedger()
	if cfg.Backlog > 0 {
		commit := workload.CommitBacklog
		how := "in transactions of 1,000"
		if cfg.BulkBacklog {
			commit, how = workload.CommitBulkBacklog, "in bulk"
		}
		logf("deploybench: committing a backlog of %d messages %s", cfg.Backlog, how)
		began := time.Now()
		if err := commit(ctx, producers, backlog, cfg.Backlog); err != nil {
			return rep, err
		}
		rep.BacklogLoad = time.Since(began)
		// The load's dead tuples and statistics are vacuum's work, not
		// the drain's: a deployment's backlog builds up over time, with
		// autovacuum running.
		if _, err := admin.Exec(ctx, "VACUUM ANALYZE outbox.pending"); err != nil {
			return rep, fmt.Errorf("deploybench: vacuum the backlog: %w", err)
		}
	}

	// The first tick comes at once: the deployment is running when the
	// producers start, as it would be in steady state (a rate schedule's
	// first tick would otherwise wait a whole period).
	schedule, err := emu.Schedule(lambdaemu.ScheduleConfig{Function: dispatchFunction, Expression: cfg.Schedule,
		Compression: cfg.Compression, FirstTickAfter: time.Millisecond})
	if err != nil {
		return rep, err
	}
	rep.Schedule = schedule.String()
	logf("deploybench: %s; offering %.0f msgs/s for %s", rep.Schedule, cfg.Rate, cfg.Duration)

	start := time.Now()
	cpu := workload.StartCPUMeter(admin, database)
	ledger := workload.NewLedger()
	produceCtx, stopProducing := context.WithTimeout(ctx, cfg.Duration)
	if cfg.Rate > 0 {
		rep.Producers, err = workload.Produce(produceCtx, workload.ProducerConfig{
			Pool: producers, Rate: cfg.Rate, MessagesPerTx: cfg.MessagesPerTx, Ledger: ledger,
		})
	} else {
		<-produceCtx.Done()
	}
	stopProducing()
	if err != nil && ctx.Err() == nil {
		return rep, err
	}
	committed := ledger.Len() + backlog.Len()
	logf("deploybench: %d messages committed; waiting up to %s for the last of them", committed, cfg.Drain)

	drainUntil := time.Now().Add(cfg.Drain)
	for target.Received() < committed && time.Now().Before(drainUntil) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	schedule.Stop()
	rep.Ticks = schedule.Ticks()
	if cfg.StopWhenDrained {
		if err := waitForWorkers(ctx, emu, rep.Ticks, cfg.Timeout); err != nil {
			return rep, err
		}
	} else {
		idleCtx, cancel := context.WithTimeout(ctx, cfg.Timeout+30*time.Second)
		err = emu.WaitIdle(idleCtx, dispatchFunction)
		cancel()
		if err != nil {
			return rep, err
		}
	}
	rep.Elapsed = time.Since(start)
	emu.Close() // the dispatchers' sessions end and report their counts
	rep.CPU = cpu.Stop(ctx, admin, database)

	rep.Measurement = workload.Measure(ledger, target)
	if cfg.Backlog > 0 {
		b := workload.Measure(backlog, target)
		// Each measurement sees the other's messages as unexpected.
		b.Unexpected -= rep.Measurement.Received
		rep.Measurement.Unexpected -= b.Received
		rep.Backlog = &BacklogDrain{Measurement: b, ScheduleStart: start}
	}
	rep.Target = target.Counts()
	if rep.Dispatch, err = emu.Stats(dispatchFunction); err != nil {
		return rep, err
	}
	invs, err := emu.Invocations(dispatchFunction)
	if err != nil {
		return rep, err
	}
	rep.Answers = sumAnswers(invs)
	for _, inv := range invs {
		if inv.Outcome == lambdaemu.OutcomeEmulatorClosed {
			rep.EndedByEmulator++
		}
	}
	rep.ErrorLines = errorLines.lines()
	if rep.ClaimCalls, err = settledClaimCalls(ctx, admin); err != nil {
		return rep, err
	}
	rep.ClaimCalls -= claimsBefore
	return rep, nil
}

// target is what the route delivers to: *workload.Target or
// *workload.EventBus.
type target interface {
	workload.Receiver
	Received() int
	Counts() workload.TargetCounts
	Close() error
}

// startTarget starts cfg.Target and returns it with the function's
// variables that point the route at it.
func startTarget(cfg Config) (target, []string, error) {
	if cfg.Target == TargetEventBridge {
		bus, err := workload.StartEventBus()
		if err != nil {
			return nil, nil, err
		}
		conc := ""
		if cfg.RouteConcurrency > 0 {
			conc = fmt.Sprintf(`,"concurrency":%d`, cfg.RouteConcurrency)
		}
		return bus, []string{
			`OUTBOX_ROUTES={"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"eventbridge","event_bus":"bench"` + conc + `}}]}`,
			"AWS_ENDPOINT_URL_EVENTBRIDGE=" + bus.URL,
		}, nil
	}
	t, err := workload.StartTarget(cfg.TargetLatency)
	if err != nil {
		return nil, nil, err
	}
	routes := fmt.Sprintf(`{"routes":[{"match":{"namespace":"*","topic":"*"},
	  "target":{"type":"http","url":%q,"signing_secret_env":"TARGET_SIGNING_SECRET","concurrency":%d}}]}`,
		t.URL, cfg.RouteConcurrency)
	return t, []string{"OUTBOX_ROUTES=" + routes, "TARGET_SIGNING_SECRET=" + t.Secret}, nil
}

// functionEnv is the dispatch function's environment: the template's
// defaults, the database, the target's variables; the caller's overrides
// go last.
func functionEnv(cfg Config, targetEnv []string) []string {
	env := append(TemplateEnv(cfg.Timeout),
		"OUTBOX_DATABASE_URL="+cfg.DatabaseURL,
		"OUTBOX_TRACING=off",
	)
	return append(env, targetEnv...)
}

// waitForWorkers waits, up to timeout, until the only invocations in
// flight are the schedule's (lingering ones): every invocation fan-out
// started has returned.
func waitForWorkers(ctx context.Context, emu *lambdaemu.Emulator, ticks int, timeout time.Duration) error {
	until := time.Now().Add(timeout)
	for {
		samples, err := emu.Concurrency(dispatchFunction)
		if err != nil {
			return err
		}
		invs, err := emu.Invocations(dispatchFunction)
		if err != nil {
			return err
		}
		scheduled := ticks
		for _, inv := range invs {
			if inv.Trigger == lambdaemu.TriggerSchedule {
				scheduled--
			}
		}
		inFlight := 0
		if len(samples) > 0 {
			inFlight = samples[len(samples)-1].InFlight
		}
		if inFlight <= scheduled || time.Now().After(until) || ctx.Err() != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settledClaimCalls reads the claim count once the sessions that ended
// have reported theirs: when two readings half a second apart agree.
func settledClaimCalls(ctx context.Context, admin *pgxpool.Pool) (int64, error) {
	last := int64(-1)
	for range 40 {
		n, err := workload.ClaimCalls(ctx, admin)
		if err != nil || n == last {
			return n, err
		}
		last = n
		time.Sleep(500 * time.Millisecond)
	}
	return last, nil
}

// Answers sum the dispatch invocations' answers (dispatch.Summary).
type Answers struct {
	Batches, Claimed, Delivered, Retried, Dead int
	// StoppedBy counts the invocations by why they stopped (drained,
	// max_batches, deadline).
	StoppedBy map[string]int
	// Workers counts the invocations fan-out started (generation 1 or
	// more); FanOutStarted and FanOutThrottled sum the fan-out decisions;
	// NotifyWakeups and Polls how lingering waits ended; Lingered their
	// time.
	Workers, FanOutStarted, FanOutThrottled, NotifyWakeups, Polls int
	Lingered                                                      time.Duration
}

func sumAnswers(invs []lambdaemu.Invocation) Answers {
	a := Answers{StoppedBy: map[string]int{}}
	for _, inv := range invs {
		var s struct {
			Batches   int    `json:"batches"`
			Claimed   int    `json:"claimed"`
			Delivered int    `json:"delivered"`
			Retried   int    `json:"retried"`
			Dead      int    `json:"dead"`
			StoppedBy string `json:"stopped_by"`

			Generation    int   `json:"generation"`
			LingeredMS    int64 `json:"lingered_ms"`
			NotifyWakeups int   `json:"notify_wakeups"`
			Polls         int   `json:"polls"`
			FanOut        *struct {
				Started   int `json:"started"`
				Throttled int `json:"throttled"`
			} `json:"fanout"`
		}
		if inv.Outcome != lambdaemu.OutcomeSucceeded || json.Unmarshal(inv.Response, &s) != nil {
			continue
		}
		a.Batches += s.Batches
		a.Claimed += s.Claimed
		a.Delivered += s.Delivered
		a.Retried += s.Retried
		a.Dead += s.Dead
		a.StoppedBy[s.StoppedBy]++
		if s.Generation > 0 {
			a.Workers++
		}
		if s.FanOut != nil {
			a.FanOutStarted += s.FanOut.Started
			a.FanOutThrottled += s.FanOut.Throttled
		}
		a.NotifyWakeups += s.NotifyWakeups
		a.Polls += s.Polls
		a.Lingered += time.Duration(s.LingeredMS) * time.Millisecond
	}
	return a
}

// lineSample keeps the first few lines it is given.
type lineSample struct {
	mu    sync.Mutex
	max   int
	kept  []string
	total int
}

func (s *lineSample) add(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total++
	if len(s.kept) < s.max {
		s.kept = append(s.kept, line)
	}
}

func (s *lineSample) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.kept...)
}
