// Command breaker measures the routes' circuit breaker and rate limit under
// steady offered load, with several dispatchers (the product's engine, each
// a scheduled invocation that runs until the queue is drained, then waits a
// tick) delivering to a local webhook:
//
//	breaker: the webhook answers 503 for -outage; the figures are the dead
//	letters (goal 0), the most attempts any message took (goal <= 2) and
//	how long after the webhook's return delivery resumed (goal: within
//	cool-down + one tick).
//
//	ratelimit: -rate-factor times the limit offered; the figures are the
//	delivered rate per second over the steady window (goal: within 10% of
//	the limit) and whether every ordering key arrived in order.
//
//	go run ./cmd/breaker -mode breaker -outage 60s -cool-down 5s
//	go run ./cmd/breaker -mode ratelimit -limit 50 -duration 30s
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/gate"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/publishers"
	"github.com/outboxkit/dispatcher/shared/route"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "breaker:", err)
		os.Exit(1)
	}
}

// receiver is the webhook: down (503) or up, recording each delivery.
type receiver struct {
	down      atomic.Bool
	mu        sync.Mutex
	delivered []time.Time
	calls     int
	lastSeq   map[string]int64
	outOfSeq  int
	seen      map[string]bool
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var env publish.Envelope
	if err := json.Unmarshal(body, &env); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.down.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if env.OrderingKey != "" {
		if env.SequenceID < r.lastSeq[env.OrderingKey] {
			r.outOfSeq++
		}
		r.lastSeq[env.OrderingKey] = env.SequenceID
	}
	if !r.seen[env.ID] {
		r.seen[env.ID] = true
		r.delivered = append(r.delivered, time.Now())
	}
	w.WriteHeader(http.StatusNoContent)
}

func run() error {
	var (
		dbURL       = scratch.URLFlag()
		mode        = flag.String("mode", "breaker", "breaker or ratelimit")
		dispatchers = flag.Int("dispatchers", 4, "concurrent dispatchers")
		offered     = flag.Int("offered", 100, "breaker: messages offered a second")
		before      = flag.Duration("before", 5*time.Second, "breaker: load before the outage")
		outage      = flag.Duration("outage", 60*time.Second, "breaker: how long the webhook answers 503")
		after       = flag.Duration("after", 15*time.Second, "breaker: load after the outage")
		coolDown    = flag.Duration("cool-down", 5*time.Second, "breaker: the route's cool_down")
		failures    = flag.Int("failures", 5, "breaker: the route's failures")
		limit       = flag.Int("limit", 50, "ratelimit: the route's per_second")
		factor      = flag.Int("rate-factor", 5, "ratelimit: offered load as a multiple of the limit")
		duration    = flag.Duration("duration", 30*time.Second, "ratelimit: how long the load is offered")
		tick        = flag.Duration("tick", time.Second, "how long a dispatcher waits after a run that drained the queue (the schedule)")
		batch       = flag.Int("batch", 100, "the engine's BatchSize")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	srv := &scratch.Server{AdminURL: *dbURL}
	if err := srv.Check(ctx); err != nil {
		return err
	}
	db, err := srv.CreateMigrated(ctx, "breaker")
	if err != nil {
		return err
	}
	defer db.Drop()
	pool, err := db.Pool(ctx, *dispatchers*2+2)
	if err != nil {
		return err
	}
	defer pool.Close()

	rcv := &receiver{lastSeq: map[string]int64{}, seen: map[string]bool{}}
	hook := httptest.NewServer(rcv)
	defer hook.Close()
	gateOpt := fmt.Sprintf(`"circuit_breaker":{"failures":%d,"cool_down":%q}`, *failures, coolDown.String())
	if *mode == "ratelimit" {
		gateOpt = fmt.Sprintf(`"rate_limit":{"per_second":%d}`, *limit)
	} else if *mode != "breaker" {
		return fmt.Errorf("-mode must be breaker or ratelimit, got %q", *mode)
	}
	routes, err := route.Parse([]byte(fmt.Sprintf(`{"routes":[{"match":{"namespace":"*","topic":"*"},
		"target":{"type":"http","url":%q,"signing_secret_env":"HOOK_SECRET","timeout":"5s","concurrency":16},
		"retry":{"max_attempts":10,"base_delay":"1s","max_delay":"30s"},%s}]}`, hook.URL+"/hook", gateOpt)), route.Options{})
	if err != nil {
		return err
	}
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("breaker-benchmark-secret-32bytes"))
	pubs, err := publishers.Build(ctx, routes, publishers.Deps{SigningSecret: func(string) string { return secret }})
	if err != nil {
		return err
	}

	// The producer: per_second messages a second in 10 steps, a quarter
	// of them on 20 ordering keys.
	produce := func(ctx context.Context, perSecond int) {
		const steps = 10
		t := time.NewTicker(time.Second / steps)
		defer t.Stop()
		n := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			msgs := make([]outbox.Message, perSecond/steps)
			for i := range msgs {
				msgs[i] = outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
				if n%4 == 0 {
					msgs[i].OrderingKey = fmt.Sprintf("acct-%d", n%20)
				}
				n++
			}
			if _, err := outbox.EnqueueBatch(ctx, pool, msgs); err != nil && ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, "enqueue:", err)
			}
		}
	}
	// The dispatchers: each runs the engine until the queue is drained,
	// then waits a tick, as a scheduled invocation would.
	dispatchAll := func(ctx context.Context) (dispatch.Summary, error) {
		sums := make([]dispatch.Summary, *dispatchers)
		errs := make([]error, *dispatchers)
		var wg sync.WaitGroup
		for i := range *dispatchers {
			e, err := dispatch.New(dispatch.Config{BatchSize: *batch, MaxBatches: 1000}, lease.NewStore(pool), routes, pubs, nil)
			if err != nil {
				return dispatch.Summary{}, err
			}
			e.SetGate(gate.NewStore(pool))
			wg.Go(func() {
				for ctx.Err() == nil {
					s, err := e.Run(ctx, dispatch.Request{WorkerID: fmt.Sprintf("bench-%d", i)})
					sums[i].Add(s)
					if err != nil && ctx.Err() == nil {
						errs[i] = err
						return
					}
					select {
					case <-ctx.Done():
					case <-time.After(*tick):
					}
				}
			})
		}
		wg.Wait()
		var total dispatch.Summary
		for _, s := range sums {
			total.Add(s)
		}
		for _, err := range errs {
			if err != nil {
				return total, err
			}
		}
		return total, nil
	}
	count := func(sql string) int {
		var n int
		if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		return n
	}

	if *mode == "breaker" {
		return runBreaker(ctx, rcv, produce, dispatchAll, count, *offered, *dispatchers, *before, *outage, *after, *coolDown, *tick)
	}
	return runRateLimit(ctx, rcv, produce, dispatchAll, count, *limit, *factor, *dispatchers, *duration)
}

type producer func(ctx context.Context, perSecond int)
type dispatcher func(ctx context.Context) (dispatch.Summary, error)
type counter func(sql string) int

func runBreaker(ctx context.Context, rcv *receiver, produce producer, dispatchAll dispatcher, count counter,
	offered, dispatchers int, before, outage, after, coolDown, tick time.Duration) error {
	fmt.Printf("circuit breaker: %d msgs/s offered for %s, the webhook down (503) for %s of it, cool-down %s, %d dispatchers, tick %s\n",
		offered, before+outage+after, outage, coolDown, dispatchers, tick)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var produced sync.WaitGroup
	produced.Go(func() { produce(loadCtx, offered) })
	dispCtx, stopDispatch := context.WithCancel(ctx)
	defer stopDispatch()
	var (
		sum     dispatch.Summary
		dispErr error
		wg      sync.WaitGroup
	)
	wg.Go(func() { sum, dispErr = dispatchAll(dispCtx) })

	time.Sleep(before)
	rcv.mu.Lock()
	callsBefore := rcv.calls
	rcv.mu.Unlock()
	rcv.down.Store(true)
	downAt := time.Now()
	time.Sleep(outage)
	rcv.down.Store(false)
	backAt := time.Now()
	rcv.mu.Lock()
	callsDuringOutage := rcv.calls
	rcv.mu.Unlock()
	time.Sleep(after)
	stopLoad()
	produced.Wait()
	// Drain what is left, then stop the dispatchers.
	for deadline := time.Now().Add(after + 2*coolDown); count(`SELECT count(*) FROM outbox.pending`) > 0 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
	}
	stopDispatch()
	wg.Wait()
	if dispErr != nil {
		return dispErr
	}

	rcv.mu.Lock()
	var resumed time.Duration = -1
	for _, at := range rcv.delivered {
		if at.After(backAt) {
			resumed = at.Sub(backAt)
			break
		}
	}
	deliveredDuring := 0
	for _, at := range rcv.delivered {
		if at.After(downAt) && at.Before(backAt) {
			deliveredDuring++
		}
	}
	delivered, outOfSeq := len(rcv.delivered), rcv.outOfSeq
	rcv.mu.Unlock()
	dead := count(`SELECT count(*) FROM outbox.dead`)
	maxAttempts := count(`SELECT greatest(coalesce((SELECT max(attempt_no) FROM outbox.attempts), 0),
		coalesce((SELECT max(attempt_count) FROM outbox.pending), 0))`)
	pending := count(`SELECT count(*) FROM outbox.pending`)
	fmt.Printf("delivered %d (%d pending at the end), dead letters %d, most attempts of a message %d, out of order %d\n",
		delivered, pending, dead, maxAttempts, outOfSeq)
	fmt.Printf("calls to the webhook during the %s outage: %d (delivered during it: %d)\n", outage, callsDuringOutage-callsBefore, deliveredDuring)
	fmt.Printf("delivery resumed %s after the webhook came back (goal: within cool-down + tick = %s)\n",
		resumed.Round(time.Millisecond), coolDown+tick)
	fmt.Printf("engine: claimed %d, delivered %d, retried %d, released %d (held by the breaker %d), dead %d\n",
		sum.Claimed, sum.Delivered, sum.Retried, sum.Released, sum.Gated, sum.Dead)
	ok := dead == 0 && maxAttempts <= 2 && resumed >= 0 && resumed <= coolDown+tick && outOfSeq == 0
	fmt.Printf("goals met: %v\n", ok)
	return nil
}

func runRateLimit(ctx context.Context, rcv *receiver, produce producer, dispatchAll dispatcher, count counter,
	limit, factor, dispatchers int, duration time.Duration) error {
	fmt.Printf("rate limit %d/s: %d msgs/s offered for %s, %d dispatchers\n", limit, limit*factor, duration, dispatchers)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var produced sync.WaitGroup
	produced.Go(func() { produce(loadCtx, limit*factor) })
	// Cancelled, not a deadline: under a deadline the engine stops
	// claiming its safety margin before it, as an invocation does.
	dispCtx, stopDispatch := context.WithCancel(ctx)
	defer stopDispatch()
	time.AfterFunc(duration, stopDispatch)
	start := time.Now()
	sum, err := dispatchAll(dispCtx)
	stopLoad()
	produced.Wait()
	if err != nil {
		return err
	}
	rcv.mu.Lock()
	times := slices.Clone(rcv.delivered)
	outOfSeq := rcv.outOfSeq
	rcv.mu.Unlock()
	// Per second over the steady window: from the 2nd second (the bucket
	// starts full) to the last whole second.
	secs := int(duration / time.Second)
	perSecond := make([]int, secs)
	for _, at := range times {
		if i := int(at.Sub(start) / time.Second); i >= 0 && i < secs {
			perSecond[i]++
		}
	}
	window := perSecond[2 : secs-1]
	total := 0
	for _, n := range window {
		total += n
	}
	mean := float64(total) / float64(len(window))
	sorted := slices.Clone(window)
	sort.Ints(sorted)
	fmt.Printf("delivered per second over seconds 2-%d: mean %.1f (%.1f%% of the limit), min %d, median %d, max %d\n",
		secs-1, mean, 100*mean/float64(limit), sorted[0], sorted[len(sorted)/2], sorted[len(sorted)-1])
	fmt.Printf("per second: %v\n", perSecond)
	fmt.Printf("ordering keys out of order: %d; engine: claimed %d, delivered %d, released %d (held by the limit %d), dead %d; pending left %d\n",
		outOfSeq, sum.Claimed, sum.Delivered, sum.Released, sum.Gated, sum.Dead, count(`SELECT count(*) FROM outbox.pending`))
	fmt.Printf("goals met: %v\n", mean >= 0.9*float64(limit) && mean <= 1.1*float64(limit) && outOfSeq == 0)
	return nil
}
