package dispatchfn

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/fanout"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
	"github.com/outboxkit/dispatcher/shared/wake"
)

// ListenApplicationName is the application_name of a lingering
// invocation's LISTEN connection, which names it in pg_stat_activity.
const ListenApplicationName = "outbox-dispatcher/dispatch-listen"

// Elastic is what an invocation needs beyond the engine to linger after
// draining and to fan out on a backlog.
type Elastic struct {
	// Waker, when set, is what a scheduled invocation lingers with, until
	// its deadline less SafetyMargin (nil: it returns once drained).
	Waker        *wake.Waker
	SafetyMargin time.Duration
	// FanOut, when set, starts workers on a backlog (nil: none).
	FanOut *fanout.Starter
}

// Answer is the dispatch function's answer: the runs' summed Summary
// (docs/ARCHITECTURE.md), and what lingering and fan-out did.
type Answer struct {
	dispatch.Summary
	// Generation is the invocation's fan-out generation (0: the
	// schedule's, or a manual invocation).
	Generation int `json:"generation"`
	// Runs counts the engine's runs: one, or more when the invocation
	// went on claiming past a run's batch budget or was woken lingering.
	Runs int `json:"runs"`
	// LingeredMS is the time spent waiting for new work; NotifyWakeups
	// and Polls count how the waits ended.
	LingeredMS    int64 `json:"lingered_ms"`
	NotifyWakeups int   `json:"notify_wakeups"`
	Polls         int   `json:"polls"`
	// FanOut is the fan-out decision, when one was taken.
	FanOut *fanout.Decision `json:"fanout,omitempty"`
}

// invocation runs the engine for one invocation. A scheduled invocation
// runs once and returns, or, lingering, runs until its deadline less the
// safety margin: again at once while runs end on their batch budget, and
// after each wake-up once drained. A fan-out worker runs until it drains
// or its deadline nears, and does not linger: the scheduled invocations
// are the ones listening. The first run that ends on its batch budget —
// work remains — decides fan-out, by the rate it measured.
func (h *Handler) invocation(ctx context.Context, log *slog.Logger, ev Event, req dispatch.Request) (answer Answer, err error) {
	start := time.Now()
	answer.Generation = ev.Generation
	answer.WorkerID = req.WorkerID
	// A named result, so that the duration reaches the caller on every path.
	defer func() { answer.DurationMS = time.Since(start).Milliseconds() }()

	el := h.Elastic
	deadline, timed := ctx.Deadline()
	linger := el.Waker != nil && timed && !ev.Worker()
	continuous := linger || ev.Worker()

	var lingerCtx context.Context
	stopListening := func() {}
	defer func() { stopListening() }()

	decided := el.FanOut == nil
	for {
		runStart := time.Now()
		var sum dispatch.Summary
		sum, err = h.Engine.Run(ctx, req)
		answer.Add(sum)
		answer.Runs++
		answer.StoppedBy = sum.StoppedBy
		if err != nil {
			return answer, err
		}
		if !decided && sum.StoppedBy == dispatch.StoppedMaxBatches {
			decided = true
			answer.FanOut = h.fanOut(ctx, log, ev, req, sum, time.Since(runStart), continuous)
		}
		switch sum.StoppedBy {
		case dispatch.StoppedMaxBatches:
			if continuous {
				continue
			}
			return answer, nil
		case dispatch.StoppedDeadline:
			return answer, nil
		}
		if !linger {
			return answer, nil
		}
		if lingerCtx == nil {
			var cancel context.CancelFunc
			lingerCtx, cancel = context.WithDeadline(ctx, deadline.Add(-el.SafetyMargin))
			listened := make(chan struct{})
			go func() {
				defer close(listened)
				el.Waker.Listen(lingerCtx)
			}()
			// The invocation returns only once the subscription has ended:
			// a frozen environment must not hold one.
			stopListening = func() { cancel(); <-listened }
		}
		waitStart := time.Now()
		cause := el.Waker.Wait(lingerCtx)
		answer.LingeredMS += time.Since(waitStart).Milliseconds()
		switch cause {
		case wake.Notified:
			answer.NotifyWakeups++
		case wake.Polled:
			answer.Polls++
		default:
			answer.StoppedBy = dispatch.StoppedDeadline
			return answer, nil
		}
	}
}

// fanOut takes the fan-out decision after a run that left work behind.
func (h *Handler) fanOut(ctx context.Context, log *slog.Logger, ev Event, req dispatch.Request, run dispatch.Summary, took time.Duration, continuous bool) *fanout.Decision {
	sit := fanout.Situation{Generation: ev.Generation, Continuous: continuous, Namespaces: req.Namespaces}
	if took > 0 {
		sit.Rate = float64(run.Claimed) / took.Seconds()
	}
	if deadline, ok := ctx.Deadline(); ok {
		sit.Left = time.Until(deadline)
	}
	d, err := h.Elastic.FanOut.ScaleOut(ctx, sit)
	if err != nil {
		log.Warn("fan-out: could not count the backlog; no workers started", "error", err.Error())
		return nil
	}
	return &d
}

// putElastic writes the lingering and fan-out metrics.
func putElastic(m *emf.Logger, a Answer) {
	handler.Put(m, "Runs", float64(a.Runs), emf.Count)
	handler.Put(m, "Lingered", float64(a.LingeredMS), emf.Milliseconds)
	handler.Put(m, "NotifyWakeups", float64(a.NotifyWakeups), emf.Count)
	handler.Put(m, "Polls", float64(a.Polls), emf.Count)
	if f := a.FanOut; f != nil {
		handler.Put(m, "FanOutStarted", float64(f.Started), emf.Count)
		handler.Put(m, "FanOutThrottled", float64(f.Throttled), emf.Count)
		handler.Put(m, "FanOutFailed", float64(f.Failed), emf.Count)
	}
}

// newElastic builds, once per cold start, the waker a lingering invocation
// waits with (and its LISTEN connection's pool) and the fan-out starter
// with its Lambda client. The returned function closes them and c.
func newElastic(ctx context.Context, cfg dispatchconfig.Dispatch, deps handler.Deps, c *handler.Common) (Elastic, func(), error) {
	el := Elastic{SafetyMargin: cfg.Engine.WithDefaults().SafetyMargin}
	closers := []func(){c.Close}
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if cfg.Linger.Enabled {
		wc := wake.Config{PollInterval: cfg.Linger.PollInterval, ListeningPollInterval: cfg.Linger.ListenPollInterval,
			Debounce: LingerDebounce, Log: c.RT.Log}
		if cfg.Linger.Listen {
			connect, closeListen, err := ListenConnector(ctx, cfg.Database, deps, ListenApplicationName)
			if err != nil {
				return Elastic{}, nil, err
			}
			closers = append(closers, closeListen)
			wc.Connect = connect
		}
		w, err := wake.New(wc)
		if err != nil {
			closeAll()
			return Elastic{}, nil, err
		}
		closers = append(closers, w.Close)
		el.Waker = w
	}
	if cfg.FanOut.Enabled() {
		awsCfg := c.AWS.Copy()
		starter, err := fanout.New(cfg.FanOut, lambda.NewFromConfig(awsCfg), c.Store)
		if err != nil {
			closeAll()
			return Elastic{}, nil, err
		}
		el.FanOut = starter
	}
	// closers[0] is c.Close: the Waker's connection closes before the pool
	// it came from.
	return el, closeAll, nil
}

// LingerDebounce is how long a notified lingering invocation waits for
// more commits before claiming: a burst of commits is one claim, and a
// message waits at most this much more.
const LingerDebounce = 5 * time.Millisecond

// ListenConnector opens a one-connection pool from the dispatch
// function's database settings (a URL, a Secrets Manager secret or RDS
// IAM) and returns what hands its connection to a wake.Waker, which owns
// it from then on; a failed one is closed, and the pool opens the next.
// appName names the connection in pg_stat_activity. The returned function
// closes the pool.
func ListenConnector(ctx context.Context, dbCfg dbpool.Config, deps handler.Deps, appName string) (wake.Connect, func(), error) {
	dbCfg.MaxConns = 1
	var pd dbpool.Deps
	if deps.AWS != nil {
		pd.AWS = deps.AWS.Copy()
	} else if dbCfg.Source != dbpool.SourceURL {
		// Only a secret or an IAM token needs AWS.
		var err error
		if pd.AWS, err = awsconfig.LoadDefaultConfig(ctx); err != nil {
			return nil, nil, fmt.Errorf("load the AWS configuration: %w", err)
		}
	}
	pd.ApplicationName = appName
	pool, err := dbpool.Open(ctx, dbCfg, pd)
	if err != nil {
		return nil, nil, fmt.Errorf("the notification listener's connection: %w", err)
	}
	return func(ctx context.Context) (*pgx.Conn, error) { return hijack(ctx, pool.Pool) }, pool.Close, nil
}

func hijack(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return c.Hijack(), nil
}
