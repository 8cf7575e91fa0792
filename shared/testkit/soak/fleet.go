package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
)

// FleetCounts sum what the functions answered and what happened to them.
type FleetCounts struct {
	Invocations      int64 `json:"invocations"`
	InvocationErrors int64 `json:"invocation_errors"`
	InitErrors       int64 `json:"cold_start_failures"`
	Launches         int64 `json:"launches"`
	Kills            int64 `json:"kills"`
	KillsMidBatch    int64 `json:"kills_with_leased_rows"`
	Overruns         int64 `json:"overruns_killed"`
	Crashes          int64 `json:"crashes"`
	Claimed          int64 `json:"claimed"`
	Delivered        int64 `json:"delivered"`
	Retried          int64 `json:"retried"`
	Dead             int64 `json:"dead"`
	LeaseLost        int64 `json:"lease_lost"`
	StoppedDrained   int64 `json:"stopped_drained"`
	StoppedDeadline  int64 `json:"stopped_deadline"`
	StoppedMax       int64 `json:"stopped_max_batches"`
	ReaperRuns       int64 `json:"reaper_invocations"`
	ReaperErrors     int64 `json:"reaper_errors"`
	ReaperRequeued   int64 `json:"reaper_requeued"`
	MetricsRuns      int64 `json:"metrics_invocations"`
	MetricsErrors    int64 `json:"metrics_errors"`
	DoubleDispatch   int64 `json:"double_dispatch_backstop_fired"`
	// Takeovers: dispatchers stopped (SIGSTOP) past their lease while they
	// held rows, and resumed (SIGCONT) once others had taken the rows over.
	Takeovers         int64 `json:"takeovers"`
	LeasedAtTakeovers int64 `json:"leased_at_takeovers"`
	TakenOver         int64 `json:"taken_over"`
	// ResumedAnswers are what each resumed dispatcher's invocation answered.
	ResumedAnswers []string `json:"resumed_answers,omitempty"`
}

// inflight collects the message ids that were leased when a fault struck:
// the messages a crash may make unavoidable duplicates of.
type inflight struct {
	mu sync.Mutex
	// atKills sums the leased rows found at each kill (the estimate the
	// bound uses); atRestarts at each database restart; orphans after
	// invocations that failed (a completion lost to a restart).
	atKills, atRestarts, orphans, atTakeovers, atReadOnly int64
	ids                                                   map[uuid.UUID]struct{}
}

func (f *inflight) add(kind *int64, ids []uuid.UUID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	*kind += int64(len(ids))
	for _, id := range ids {
		f.ids[id] = struct{}{}
	}
}

// fleet runs the functions: the dispatch workers, the reaper and the
// metrics exporter, each a real bootstrap binary under the Runtime API.
type fleet struct {
	cfg      Config
	binaries map[string]string
	env      []string
	admin    *pgxpool.Pool
	inflight *inflight
	events   [][]byte
	log      func(format string, args ...any)

	mu      sync.Mutex
	counts  FleetCounts
	workers []*worker
	stop    atomic.Bool
	wg      sync.WaitGroup
	// lastStats is the metrics function's latest snapshot totals.
	lastStats atomic.Pointer[statsTotals]
}

type statsTotals struct {
	Pending       int64 `json:"pending"`
	Due           int64 `json:"due"`
	Leased        int64 `json:"leased"`
	ExpiredLeases int64 `json:"expired_leases"`
	Dead          int64 `json:"dead"`
}

// worker is one dispatch "function instance": a process invoked in a loop,
// as EventBridge Scheduler ticks would, relaunched when it dies.
type worker struct {
	name string
	mu   sync.Mutex
	fn   *lambdatest.Function
	busy atomic.Bool
	// killed is set by the killer just before it sends SIGKILL.
	killed atomic.Bool
	// stopped is set while the worker's process is SIGSTOPped for a
	// takeover, until its invocation answers.
	stopped atomic.Bool
	// frozen is set from just before SIGSTOP to just after SIGCONT: the
	// killer leaves the worker alone (a kill would end the takeover, and
	// SIGCONT would go to a pid that may be reused).
	frozen atomic.Bool
}

func (f *fleet) add(fn func(*FleetCounts)) {
	f.mu.Lock()
	fn(&f.counts)
	f.mu.Unlock()
}

// Counts returns the fleet's counters.
func (f *fleet) Counts() FleetCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.counts
	c.ResumedAnswers = append([]string(nil), c.ResumedAnswers...)
	return c
}

func (f *fleet) launch(binary, name string, extra ...string) (*lambdatest.Function, error) {
	fn, err := lambdatest.Launch(binary, name, append(append([]string{}, f.env...), extra...)...)
	if err != nil {
		return nil, err
	}
	f.add(func(c *FleetCounts) { c.Launches++ })
	return fn, nil
}

// start launches the dispatch workers, the reaper and the metrics loop.
func (f *fleet) start(ctx context.Context) {
	for i := range f.cfg.Dispatchers {
		w := &worker{name: fmt.Sprintf("soak-dispatch-%d", i)}
		f.workers = append(f.workers, w)
		f.wg.Go(func() { f.dispatchLoop(ctx, w) })
	}
	f.wg.Go(func() { f.reaperLoop(ctx) })
	f.wg.Go(func() { f.metricsLoop(ctx) })
}

// shutdown stops every loop after its current invocation and stops the
// processes.
func (f *fleet) shutdown() {
	f.stop.Store(true)
	f.wg.Wait()
}

func (f *fleet) dispatchLoop(ctx context.Context, w *worker) {
	defer func() {
		w.mu.Lock()
		if w.fn != nil {
			f.retire(w.fn)
			w.fn.Stop()
		}
		w.mu.Unlock()
	}()
	for n := 0; !f.stop.Load() && ctx.Err() == nil; n++ {
		w.mu.Lock()
		fn := w.fn
		w.mu.Unlock()
		if fn == nil {
			var err error
			fn, err = f.launch(f.binaries["dispatch"], w.name,
				"OUTBOX_BATCH_SIZE="+fmt.Sprint(f.cfg.BatchSize), "OUTBOX_MAX_BATCHES=1000",
				"OUTBOX_FUNCTION_TIMEOUT="+f.cfg.Budget.String(), "OUTBOX_SAFETY_MARGIN=2s",
				"OUTBOX_LEASE="+f.cfg.Lease.String(), "OUTBOX_ROUTES="+f.cfg.routes)
			if err != nil {
				f.log("launch %s: %v", w.name, err)
				time.Sleep(time.Second)
				continue
			}
			w.mu.Lock()
			w.fn = fn
			w.mu.Unlock()
		}
		event := f.events[n%len(f.events)]
		w.busy.Store(true)
		// Room for a takeover's stop (a lease and two reaper runs) before
		// the process counts as overrunning.
		ictx, cancel := context.WithTimeout(ctx, f.cfg.Budget+f.cfg.Lease+2*f.cfg.ReaperEvery+15*time.Second)
		resp, err := fn.Invoke(ictx, event, f.cfg.Budget)
		cancel()
		w.busy.Store(false)
		f.add(func(c *FleetCounts) { c.Invocations++ })
		if w.stopped.Swap(false) {
			answer := ""
			switch {
			case err != nil:
				answer = "no answer: " + err.Error()
			case resp.Err != nil:
				answer = "error: " + resp.Err.Error()
			default:
				answer = "summary: " + string(resp.Body)
			}
			f.add(func(c *FleetCounts) { c.ResumedAnswers = append(c.ResumedAnswers, answer) })
			f.log("%s resumed after its takeover answered %.300s", w.name, answer)
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			// The process died (SIGKILL from the killer, or a crash of its
			// own), or overran its deadline so far that Lambda would have
			// killed it.
			killed := w.killed.Swap(false)
			if exited, _ := fn.Exited(); !killed && !exited {
				f.add(func(c *FleetCounts) { c.Overruns++ })
				fn.Kill()
			} else if !killed {
				f.add(func(c *FleetCounts) { c.Crashes++ })
			}
			ids := f.leasedBy(ctx, w.name)
			f.inflight.add(&f.inflight.atKills, ids)
			if killed && len(ids) > 0 {
				f.add(func(c *FleetCounts) { c.KillsMidBatch++ })
			}
			f.retire(fn)
			fn.Stop()
			w.mu.Lock()
			w.fn = nil
			w.mu.Unlock()
		case resp.Err != nil:
			if resp.Err.Init {
				f.add(func(c *FleetCounts) { c.InitErrors++ })
				f.retire(fn)
				fn.Stop()
				w.mu.Lock()
				w.fn = nil
				w.mu.Unlock()
			} else {
				f.add(func(c *FleetCounts) { c.InvocationErrors++ })
			}
			// Whatever this process still holds will never be completed:
			// a completion lost to a restart.
			f.inflight.add(&f.inflight.orphans, f.leasedBy(ctx, w.name))
			time.Sleep(time.Duration(100+rand.IntN(200)) * time.Millisecond)
		default:
			var s dispatch.Summary
			if err := json.Unmarshal(resp.Body, &s); err != nil {
				f.log("%s: undecodable answer %q", w.name, resp.Body)
				continue
			}
			f.add(func(c *FleetCounts) {
				c.Claimed += int64(s.Claimed)
				c.Delivered += int64(s.Delivered)
				c.Retried += int64(s.Retried)
				c.Dead += int64(s.Dead)
				c.LeaseLost += int64(s.LeaseLost)
				switch s.StoppedBy {
				case dispatch.StoppedDrained:
					c.StoppedDrained++
				case dispatch.StoppedDeadline:
					c.StoppedDeadline++
				case dispatch.StoppedMaxBatches:
					c.StoppedMax++
				}
			})
			if s.StoppedBy == dispatch.StoppedDrained {
				// The next schedule tick.
				time.Sleep(f.cfg.Tick/2 + rand.N(f.cfg.Tick))
			}
		}
	}
}

// retire scans a process's output before it is dropped: the
// double-delivery backstop must never have fired.
func (f *fleet) retire(fn *lambdatest.Function) {
	if n := strings.Count(fn.Stdout(), "double-delivery backstop fired"); n > 0 {
		f.add(func(c *FleetCounts) { c.DoubleDispatch += int64(n) })
	}
}

// leasedBy lists the rows leased by a worker's processes (worker ids are
// the function name, a colon and the request id). It retries while the
// database is away.
func (f *fleet) leasedBy(ctx context.Context, name string) []uuid.UUID {
	return f.leased(ctx, leasedSQL+` WHERE h.claimed_by LIKE $1`, name+":%")
}

// leasedSQL lists the leased messages of the leases it is given as h: each
// leased row, and the messages of the run leased with an ordered head
// (outbox.pending.run_through), which hold no lease of their own.
const leasedSQL = `SELECT r.id FROM outbox.pending h
	CROSS JOIN LATERAL (
		SELECT h.id
		UNION ALL
		SELECT f.id FROM outbox.pending f
		WHERE h.run_through IS NOT NULL AND f.namespace = h.namespace AND f.ordering_key = h.ordering_key
		  AND f.sequence_id > h.sequence_id AND f.sequence_id <= h.run_through) r`

func (f *fleet) leased(ctx context.Context, sql string, args ...any) []uuid.UUID {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rows, err := f.admin.Query(ctx, sql, args...)
		if err == nil {
			var ids []uuid.UUID
			for rows.Next() {
				var id uuid.UUID
				if err = rows.Scan(&id); err != nil {
					break
				}
				ids = append(ids, id)
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
			if err == nil {
				return ids
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			f.log("listing leased rows: %v", err)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill SIGKILLs a worker that is in the middle of an invocation, at a
// random point of it.
func (f *fleet) kill(ctx context.Context) {
	for ctx.Err() == nil {
		w := f.workers[rand.IntN(len(f.workers))]
		if !w.busy.Load() {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		time.Sleep(rand.N(f.cfg.Budget / 3))
		w.mu.Lock()
		fn := w.fn
		w.mu.Unlock()
		if fn == nil || !w.busy.Load() || w.frozen.Load() {
			continue
		}
		w.killed.Store(true)
		fn.Kill()
		f.add(func(c *FleetCounts) { c.Kills++ })
		return
	}
}

// takeover stops (SIGSTOP) a worker in the middle of an invocation while
// it holds leased rows, keeps it stopped past its lease and two reaper runs
// (so that the reaper or another dispatcher's claim takes its rows over),
// then resumes it (SIGCONT). What it then does with its stale batch is
// fenced: its completion, if it makes one, is refused as lease_lost.
func (f *fleet) takeover(ctx context.Context) error {
	for ctx.Err() == nil {
		w := f.workers[rand.IntN(len(f.workers))]
		if !w.busy.Load() {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		time.Sleep(rand.N(f.cfg.Budget / 4))
		w.mu.Lock()
		fn := w.fn
		w.mu.Unlock()
		if fn == nil || !w.busy.Load() {
			continue
		}
		pid := fn.PID()
		w.frozen.Store(true)
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			w.frozen.Store(false)
			continue
		}
		ids := f.leasedBy(ctx, w.name)
		if len(ids) == 0 {
			// Between batches: nothing to take over; let it go on.
			_ = syscall.Kill(pid, syscall.SIGCONT)
			w.frozen.Store(false)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		w.stopped.Store(true)
		f.log("%s stopped (SIGSTOP) holding %d leased rows", w.name, len(ids))
		f.inflight.add(&f.inflight.atTakeovers, ids)
		// Stopped for the lease and two reaper runs at least, and until
		// some of its rows are taken over (however slow the machine):
		// no longer leased by the stopped worker (requeued by the reaper
		// or a claim, and perhaps delivered since).
		var taken int64
		var err error
		for until := time.Now().Add(f.cfg.Lease + 2*f.cfg.ReaperEvery); ; {
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(until)):
			}
			err = f.admin.QueryRow(context.WithoutCancel(ctx), `SELECT count(*) FROM unnest($1::uuid[]) AS x(id)
				WHERE NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.id = x.id AND p.claimed_by LIKE $2)`,
				ids, w.name+":%").Scan(&taken)
			if taken > 0 || ctx.Err() != nil {
				break
			}
			until = time.Now().Add(250 * time.Millisecond)
		}
		_ = syscall.Kill(pid, syscall.SIGCONT)
		w.frozen.Store(false)
		if err != nil {
			return fmt.Errorf("takeover of %s: counting the rows taken over: %w", w.name, err)
		}
		f.add(func(c *FleetCounts) {
			c.Takeovers++
			c.LeasedAtTakeovers += int64(len(ids))
			c.TakenOver += taken
		})
		f.log("%s resumed (SIGCONT): %d of its %d leased rows taken over", w.name, taken, len(ids))
		return nil
	}
	return ctx.Err()
}

func (f *fleet) reaperLoop(ctx context.Context) {
	var fn *lambdatest.Function
	defer func() {
		if fn != nil {
			fn.Stop()
		}
	}()
	for !f.stop.Load() && ctx.Err() == nil {
		if fn == nil {
			var err error
			if fn, err = f.launch(f.binaries["reaper"], "soak-reaper", "OUTBOX_REAPER_BATCH_SIZE=5000"); err != nil {
				f.log("launch reaper: %v", err)
				time.Sleep(time.Second)
				continue
			}
		}
		ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var out struct {
			Requeued int `json:"requeued"`
		}
		err := fn.InvokeJSON(ictx, f.events[0], 15*time.Second, &out)
		cancel()
		f.add(func(c *FleetCounts) {
			c.ReaperRuns++
			c.ReaperRequeued += int64(out.Requeued)
		})
		if err != nil {
			f.add(func(c *FleetCounts) { c.ReaperErrors++ })
			var fe *lambdatest.FunctionError
			if !errors.As(err, &fe) || fe.Init {
				fn.Stop()
				fn = nil
			}
		}
		sleepUnlessStopped(&f.stop, f.cfg.ReaperEvery)
	}
}

func (f *fleet) metricsLoop(ctx context.Context) {
	var fn *lambdatest.Function
	defer func() {
		if fn != nil {
			fn.Stop()
		}
	}()
	for !f.stop.Load() && ctx.Err() == nil {
		if fn == nil {
			var err error
			if fn, err = f.launch(f.binaries["metrics"], "soak-metrics"); err != nil {
				f.log("launch metrics: %v", err)
				time.Sleep(time.Second)
				continue
			}
		}
		ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var snap struct {
			Totals statsTotals `json:"totals"`
		}
		err := fn.InvokeJSON(ictx, f.events[0], 15*time.Second, &snap)
		cancel()
		f.add(func(c *FleetCounts) { c.MetricsRuns++ })
		if err != nil {
			f.add(func(c *FleetCounts) { c.MetricsErrors++ })
			var fe *lambdatest.FunctionError
			if !errors.As(err, &fe) || fe.Init {
				fn.Stop()
				fn = nil
			}
		} else {
			f.lastStats.Store(&snap.Totals)
		}
		sleepUnlessStopped(&f.stop, 5*time.Second)
	}
}

func sleepUnlessStopped(stop *atomic.Bool, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end) && !stop.Load(); {
		time.Sleep(min(100*time.Millisecond, time.Until(end)))
	}
}
