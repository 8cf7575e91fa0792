// Package serve is the long-running dispatcher (`outboxctl serve`), for
// deployments that need sub-second latency or run outside Lambda. It drives
// the same engine as the dispatch function (shared/dispatch, wired by
// dispatchfn.New from the same environment) and the reaper function's
// handler, but instead of waiting for a schedule it is woken by PostgreSQL:
//
//	producer commit ──► trigger pending_notify (migrations/functions/notify_pending.sql)
//	                      │ NOTIFY outbox_pending (one per statement, folded per transaction)
//	                      ▼
//	listener (own connection) ──► wake ──► debounce ──► drain: claim → publish → complete,
//	                                          ▲            batch after batch until one
//	poll timer (fallback) ────────────────────┘            comes back short
//	reaper timer ──► repair expired leases, purge
//
// Notifications only say "there may be work"; the claim is the same
// FOR UPDATE SKIP LOCKED claim the functions use, so any number of servers
// and functions can run side by side. The waiting is package wake's, shared
// with a lingering dispatch invocation: a notification can be lost, so the
// server also polls, and after every (re)connection of its listener it
// drains once to catch up; wake-ups are coalesced, and debounced so that a
// burst of producer commits is claimed as one batch.
//
// The server writes the dispatch function's metrics (EMF, the same names)
// once per MetricsInterval, with its wake-ups: NotifyWakeups and Polls.
//
// # Shutdown
//
// Cancelling Run's context stops claiming. The batch in hand is still
// published and completed (its messages are delivered or scheduled for
// retry, never left leased), unless that takes longer than ShutdownTimeout:
// then its publish calls are cancelled, and the batch is completed as
// retryable. Run then returns nil.
package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/reaperfn"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
	"github.com/outboxkit/dispatcher/shared/wake"
)

// Channel is the notification channel of the pending_notify trigger
// (migrations/functions/notify_pending.sql).
const Channel = wake.Channel

// Defaults of Config.
const (
	DefaultPollInterval    = time.Second
	DefaultDebounce        = 10 * time.Millisecond
	DefaultShutdownTimeout = 30 * time.Second
	DefaultMetricsInterval = time.Minute

	// A failed drain is tried again after a delay doubling from the
	// first to the last.
	firstRetryDelay = 250 * time.Millisecond
	lastRetryDelay  = 30 * time.Second
)

// Dispatcher runs one bounded dispatch run; *dispatch.Engine is one.
type Dispatcher interface {
	Run(ctx context.Context, req dispatch.Request) (dispatch.Summary, error)
}

var _ Dispatcher = (*dispatch.Engine)(nil)

// Reaper runs one reaper pass; *reaperfn.Handler is one.
type Reaper interface {
	Handle(ctx context.Context, raw json.RawMessage) (reaperfn.Summary, error)
}

var _ Reaper = (*reaperfn.Handler)(nil)

// Connect opens the connection the listener owns; it is closed and opened
// again when it fails.
type Connect = wake.Connect

// Config tunes a Server. Zero fields take their defaults, except
// ReaperInterval.
type Config struct {
	// WorkerID names this server in leases and attempts (required).
	WorkerID string
	// BatchSize overrides the engine's batch size when positive.
	BatchSize int
	// PollInterval is the longest the server stays idle without claiming
	// (default DefaultPollInterval): it bounds the delay of messages whose
	// notification was lost and of retries becoming due.
	PollInterval time.Duration
	// Debounce is how long a wake-up waits for more commits before claiming
	// (default DefaultDebounce).
	Debounce time.Duration
	// ReaperInterval runs the reaper this often, and once at start; zero
	// runs no reaper (the reaper function does it).
	ReaperInterval time.Duration
	// ShutdownTimeout bounds the batch in hand after Run's context is
	// cancelled (default DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// Log receives the server's own events (default: discarded).
	Log *slog.Logger
	// Metrics, when set, receives an EMF document every MetricsInterval
	// (default DefaultMetricsInterval) and one at shutdown, with the
	// dispatch function's metric names for what the server did in that
	// interval, and its wake-ups (NotifyWakeups, Polls). Open sets it to
	// the dispatch runtime, which writes to the process's stdout.
	Metrics         *handler.Runtime
	MetricsInterval time.Duration
}

func (c Config) withDefaults() Config {
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Debounce <= 0 {
		c.Debounce = DefaultDebounce
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.MetricsInterval <= 0 {
		c.MetricsInterval = DefaultMetricsInterval
	}
	return c
}

// Totals count what a server has done since it started.
type Totals struct {
	Batches   int64 `json:"batches"`
	Claimed   int64 `json:"claimed"`
	Delivered int64 `json:"delivered"`
	Retried   int64 `json:"retried"`
	Dead      int64 `json:"dead"`
	LeaseLost int64 `json:"lease_lost"`
	// Wakeups counts notifications acted on (after coalescing), Polls the
	// drains the poll timer started.
	Wakeups int64 `json:"wakeups"`
	Polls   int64 `json:"polls"`
	// Reconnects counts LISTEN connections after the first.
	Reconnects int64 `json:"reconnects"`
}

// Server is a long-running dispatcher. Build it with New (or Open), then
// Run it once.
type Server struct {
	cfg        Config
	dispatcher Dispatcher
	reaper     Reaper
	connect    Connect

	waker *wake.Waker

	batches, claimed, delivered, retried, dead, leaseLost atomic.Int64
	// startPolls is the drain at start, counted as a poll.
	startPolls atomic.Int64
}

// New returns a server. reaper may be nil when cfg.ReaperInterval is zero;
// connect may be nil to poll only.
func New(cfg Config, d Dispatcher, reaper Reaper, connect Connect) (*Server, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.WorkerID == "":
		return nil, errors.New("serve: a worker id is required")
	case d == nil:
		return nil, errors.New("serve: a dispatcher is required")
	case cfg.ReaperInterval < 0:
		return nil, fmt.Errorf("serve: the reaper interval must not be negative, got %s", cfg.ReaperInterval)
	case cfg.ReaperInterval > 0 && reaper == nil:
		return nil, errors.New("serve: a reaper interval without a reaper")
	}
	waker, err := wake.New(wake.Config{PollInterval: cfg.PollInterval, Debounce: cfg.Debounce, Connect: connect, Log: cfg.Log})
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, dispatcher: d, reaper: reaper, connect: connect, waker: waker}, nil
}

// Listening is closed once the listener has subscribed to Channel for the
// first time.
func (s *Server) Listening() <-chan struct{} { return s.waker.Listening() }

// Totals returns the counts so far.
func (s *Server) Totals() Totals {
	w := s.waker.Counts()
	return Totals{
		Batches: s.batches.Load(), Claimed: s.claimed.Load(), Delivered: s.delivered.Load(),
		Retried: s.retried.Load(), Dead: s.dead.Load(), LeaseLost: s.leaseLost.Load(),
		Wakeups: w.NotifyWakeups, Polls: w.Polls + s.startPolls.Load(), Reconnects: w.Reconnects,
	}
}

// Run serves until ctx is cancelled, then finishes the batch in hand (see
// the package documentation) and returns nil.
func (s *Server) Run(ctx context.Context) error {
	log := s.cfg.Log
	// work outlives ctx: cancelling ctx stops claiming, while the batch in
	// hand is published under work, cancelled only ShutdownTimeout later.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var hardStop *time.Timer
	var hardStopMu sync.Mutex
	stopWatching := context.AfterFunc(ctx, func() {
		hardStopMu.Lock()
		defer hardStopMu.Unlock()
		hardStop = time.AfterFunc(s.cfg.ShutdownTimeout, func() {
			log.Warn("shutdown timeout: cancelling the batch in hand; it is completed as retryable",
				"shutdown_timeout", s.cfg.ShutdownTimeout.String())
			cancelWork()
		})
	})
	defer func() {
		stopWatching()
		hardStopMu.Lock()
		if hardStop != nil {
			hardStop.Stop()
		}
		hardStopMu.Unlock()
	}()

	log.Info("serve started", "worker_id", s.cfg.WorkerID, "channel", Channel,
		"poll_interval", s.cfg.PollInterval.String(), "debounce", s.cfg.Debounce.String(),
		"reaper_interval", s.cfg.ReaperInterval.String(), "shutdown_timeout", s.cfg.ShutdownTimeout.String())

	var wg sync.WaitGroup
	if s.connect != nil {
		wg.Go(func() { s.waker.Listen(ctx) })
	}
	if s.reaper != nil {
		wg.Go(func() { s.reap(ctx) })
	}
	var last Totals
	if s.cfg.Metrics != nil {
		wg.Go(func() { s.reportMetrics(ctx, &last) })
	}
	s.dispatchLoop(ctx, work)
	wg.Wait()
	s.waker.Close()
	if s.cfg.Metrics != nil {
		s.writeMetrics(ctx, &last) // what the last interval did
	}

	t := s.Totals()
	log.Info("serve stopped", "worker_id", s.cfg.WorkerID, "batches", t.Batches, "claimed", t.Claimed,
		"delivered", t.Delivered, "retried", t.Retried, "dead", t.Dead, "lease_lost", t.LeaseLost,
		"wakeups", t.Wakeups, "polls", t.Polls, "reconnects", t.Reconnects)
	return nil
}

func (s *Server) dispatchLoop(ctx, work context.Context) {
	// The first drain happens at once: there may be a backlog.
	s.startPolls.Add(1)
	var failures int
	for {
		if err := s.drain(ctx, work); err != nil {
			failures++
			delay := min(firstRetryDelay<<min(failures, 8), s.cfg.PollInterval, lastRetryDelay)
			s.cfg.Log.Error("dispatch failed; trying again", "error", err.Error(), "retry_in", delay.String())
			if !backoff.Sleep(ctx, delay) {
				return
			}
		} else {
			failures = 0
		}
		if s.waker.Wait(ctx) == wake.Stopped {
			return
		}
	}
}

// drain claims batch after batch until one comes back short, or ctx is
// cancelled. Each run claims one batch, so that a cancellation is noticed
// between batches and never interrupts one.
func (s *Server) drain(ctx, work context.Context) error {
	for ctx.Err() == nil {
		sum, err := s.dispatcher.Run(work, dispatch.Request{
			WorkerID: s.cfg.WorkerID, BatchSize: s.cfg.BatchSize, MaxBatches: 1, Log: s.cfg.Log,
		})
		s.record(sum)
		if err != nil {
			return err
		}
		if sum.StoppedBy != dispatch.StoppedMaxBatches {
			return nil // short batch: drained
		}
	}
	return nil
}

func (s *Server) record(sum dispatch.Summary) {
	if sum.Claimed == 0 {
		return
	}
	s.batches.Add(int64(sum.Batches))
	s.claimed.Add(int64(sum.Claimed))
	s.delivered.Add(int64(sum.Delivered))
	s.retried.Add(int64(sum.Retried))
	s.dead.Add(int64(sum.Dead))
	s.leaseLost.Add(int64(sum.LeaseLost))
	s.cfg.Log.Debug("batch done", "worker_id", sum.WorkerID, "claimed", sum.Claimed, "delivered", sum.Delivered,
		"retried", sum.Retried, "dead", sum.Dead, "lease_lost", sum.LeaseLost, "duration_ms", sum.DurationMS)
}

// reportMetrics writes the metrics of each MetricsInterval until ctx ends.
func (s *Server) reportMetrics(ctx context.Context, last *Totals) {
	ticker := time.NewTicker(s.cfg.MetricsInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			s.writeMetrics(ctx, last)
		}
	}
}

// writeMetrics writes one EMF document of what happened since last, and
// moves last on. Only reportMetrics, then Run after it, call it.
func (s *Server) writeMetrics(ctx context.Context, last *Totals) {
	now := s.Totals()
	rt := s.cfg.Metrics
	m := rt.Metrics(context.WithoutCancel(ctx), false)
	for _, v := range []struct {
		name string
		now  int64
		then int64
	}{
		{"Batches", now.Batches, last.Batches}, {"Claimed", now.Claimed, last.Claimed},
		{"Delivered", now.Delivered, last.Delivered}, {"Retried", now.Retried, last.Retried},
		{"DeadLettered", now.Dead, last.Dead}, {"LeaseLost", now.LeaseLost, last.LeaseLost},
		{"NotifyWakeups", now.Wakeups, last.Wakeups}, {"Polls", now.Polls, last.Polls},
		{"ListenReconnects", now.Reconnects, last.Reconnects},
	} {
		handler.Put(m, v.name, float64(v.now-v.then), emf.Count)
	}
	rt.Flush(m, s.cfg.Log)
	*last = now
}

// reap runs the reaper at once and then every ReaperInterval.
func (s *Server) reap(ctx context.Context) {
	ticker := time.NewTicker(s.cfg.ReaperInterval)
	defer ticker.Stop()
	for {
		// The reaper handler logs its own summary and failures.
		if _, err := s.reaper.Handle(ctx, nil); err != nil && ctx.Err() == nil {
			s.cfg.Log.Error("reaper failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
