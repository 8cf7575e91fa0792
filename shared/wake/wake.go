// Package wake tells a dispatcher when to claim again: when PostgreSQL
// notifies that a producer committed (LISTEN on a connection of its own),
// or when the poll interval has passed without a notification. Both the
// long-lived server (shared/serve) and a lingering dispatch invocation
// (shared/dispatch, Engine.Serve) wait with it, so that the wake-up logic
// exists once.
//
//	producer commit ──► trigger pending_notify (migrations/functions/notify_pending.sql)
//	                      │ NOTIFY outbox_pending (one per transaction)
//	                      ▼
//	Listen (own connection) ──► Notify ──► one pending wake-up ──► Wait returns Notified
//	poll timer ───────────────────────────────────────────────────► Wait returns Polled
//
// Notifications only say "there may be work"; they are coalesced: while the
// dispatcher works, any number of them leave one pending wake-up, and after
// one Wait lets Debounce pass so that a burst of commits is claimed as one
// batch. A notification can be lost (the trigger disabled, the connection
// dropped, a retry becoming due, which is an UPDATE and notifies nobody),
// so Wait also returns after the poll interval, and every (re)subscription
// counts as a wake-up to catch up on what no one heard.
//
// Two poll intervals: PollInterval while nothing listens (LISTEN is off,
// e.g. behind RDS Proxy, which pins a session that LISTENs; or the
// connection is being re-established), and ListeningPollInterval while the
// subscription stands, when polling is only a safety net and can be rare.
//
// The connection is kept between Listen calls with no subscription left on
// it (UNLISTEN *): a Lambda environment is frozen between invocations, and
// a frozen session still subscribed would hold back the server's
// notification queue for every other session until it thawed.
package wake

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/backoff"
)

// Channel is the notification channel of the pending_notify trigger
// (migrations/functions/notify_pending.sql).
const Channel = "outbox_pending"

// Reconnection of the listener backs off from the first delay to the last.
const (
	firstReconnectDelay = 250 * time.Millisecond
	lastReconnectDelay  = 30 * time.Second
)

// Connect opens a connection for LISTEN; the waker owns it until Close,
// and closes it when it fails.
type Connect func(ctx context.Context) (*pgx.Conn, error)

// Config tunes a Waker.
type Config struct {
	// PollInterval is the longest Wait lasts while no subscription stands
	// (required).
	PollInterval time.Duration
	// ListeningPollInterval is the longest Wait lasts while subscribed
	// (default PollInterval).
	ListeningPollInterval time.Duration
	// Debounce is how long Wait lets pass after a notification, for more
	// commits to arrive (zero: none).
	Debounce time.Duration
	// Connect opens the LISTEN connection; nil polls only.
	Connect Connect
	// Log hears about the subscription (default: discarded).
	Log *slog.Logger
}

// Cause says why Wait returned.
type Cause int

const (
	// Notified: a notification (or a (re)subscription's catch-up).
	Notified Cause = iota + 1
	// Polled: the poll interval passed.
	Polled
	// Stopped: the context ended.
	Stopped
)

// Counts are what a waker has done since it was built.
type Counts struct {
	// NotifyWakeups counts Waits ended by a notification, after
	// coalescing; Polls those ended by the poll interval.
	NotifyWakeups int64
	Polls         int64
	// Subscriptions counts LISTENs issued; Reconnects the connections
	// opened after a failed one.
	Subscriptions int64
	Reconnects    int64
}

// Waker waits for a reason to claim. Listen and Wait may run at the same
// time; Listen calls must not overlap each other.
type Waker struct {
	cfg Config
	// pending holds at most one wake-up: that is the coalescing.
	pending    chan struct{}
	subscribed atomic.Bool
	listening  chan struct{}
	listenOnce sync.Once

	// conn is Listen's alone while it runs, and Close's after.
	conn        *pgx.Conn
	connections int

	notifyWakeups, polls, subscriptions, reconnects atomic.Int64
}

// New returns a waker.
func New(cfg Config) (*Waker, error) {
	if cfg.PollInterval <= 0 {
		return nil, fmt.Errorf("wake: the poll interval must be positive, got %s", cfg.PollInterval)
	}
	if cfg.ListeningPollInterval <= 0 {
		cfg.ListeningPollInterval = cfg.PollInterval
	}
	if cfg.Debounce < 0 {
		return nil, fmt.Errorf("wake: the debounce must not be negative, got %s", cfg.Debounce)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Waker{cfg: cfg, pending: make(chan struct{}, 1), listening: make(chan struct{})}, nil
}

// Listening is closed once the waker has subscribed for the first time.
func (w *Waker) Listening() <-chan struct{} { return w.listening }

// Listens reports whether a Connect was given: whether Listen does
// anything.
func (w *Waker) Listens() bool { return w.cfg.Connect != nil }

// Subscribed reports whether a subscription stands now.
func (w *Waker) Subscribed() bool { return w.subscribed.Load() }

// Counts returns the counts so far.
func (w *Waker) Counts() Counts {
	return Counts{NotifyWakeups: w.notifyWakeups.Load(), Polls: w.polls.Load(),
		Subscriptions: w.subscriptions.Load(), Reconnects: w.reconnects.Load()}
}

// Notify records a wake-up; one already pending absorbs it.
func (w *Waker) Notify() {
	select {
	case w.pending <- struct{}{}:
	default:
	}
}

// Wait returns when a wake-up is pending (after Debounce), when the poll
// interval has passed since the call, or when ctx ends.
func (w *Waker) Wait(ctx context.Context) Cause {
	interval := w.cfg.PollInterval
	if w.subscribed.Load() {
		interval = w.cfg.ListeningPollInterval
	}
	poll := time.NewTimer(interval)
	defer poll.Stop()
	select {
	case <-ctx.Done():
		return Stopped
	case <-w.pending:
		w.notifyWakeups.Add(1)
		if w.cfg.Debounce > 0 && !backoff.Sleep(ctx, w.cfg.Debounce) {
			return Stopped
		}
		return Notified
	case <-poll.C:
		w.polls.Add(1)
		return Polled
	}
}

// Listen keeps a subscription to Channel until ctx ends, turning each
// notification into a wake-up and re-subscribing with backoff when the
// connection fails; without a Connect it returns at once. On return the
// connection, if still sound, is kept for the next Listen with no
// subscription left on it.
func (w *Waker) Listen(ctx context.Context) {
	if w.cfg.Connect == nil {
		return
	}
	log := w.cfg.Log
	delay := firstReconnectDelay
	for ctx.Err() == nil {
		if err := w.subscribe(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("cannot listen for notifications; polling meanwhile", "error", err.Error(),
				"retry_in", delay.String(), "poll_interval", w.cfg.PollInterval.String())
			if !backoff.Sleep(ctx, delay) {
				return
			}
			delay = min(delay*2, lastReconnectDelay)
			continue
		}
		delay = firstReconnectDelay
		w.listenOnce.Do(func() { close(w.listening) })
		// Whatever was committed while no one listened was announced to
		// no one: wake once to catch up.
		w.Notify()
		err := w.receive(ctx)
		w.subscribed.Store(false)
		if ctx.Err() != nil {
			w.unsubscribe(ctx)
			return
		}
		w.drop()
		log.Warn("lost the notification connection; polling until it is back", "error", err.Error(),
			"poll_interval", w.cfg.PollInterval.String())
	}
}

// subscribe issues LISTEN, on the kept connection or a new one.
func (w *Waker) subscribe(ctx context.Context) error {
	if w.conn == nil {
		conn, err := w.cfg.Connect(ctx)
		if err != nil {
			return err
		}
		w.conn = conn
		if w.connections++; w.connections > 1 {
			w.reconnects.Add(1)
		}
	}
	if _, err := w.conn.Exec(ctx, "LISTEN "+pgx.Identifier{Channel}.Sanitize()); err != nil {
		w.drop()
		return fmt.Errorf("LISTEN %s: %w", Channel, err)
	}
	w.subscribed.Store(true)
	if w.subscriptions.Add(1) > 1 && w.connections > 1 {
		w.cfg.Log.Info("listening for notifications again", "channel", Channel)
	} else {
		w.cfg.Log.Debug("listening for notifications", "channel", Channel)
	}
	return nil
}

// receive waits for notifications until the connection fails or ctx ends.
func (w *Waker) receive(ctx context.Context) error {
	for {
		if _, err := w.conn.WaitForNotification(ctx); err != nil {
			return err
		}
		w.Notify()
	}
}

// unsubscribe ends the subscription but keeps the connection; one that
// fails to is closed.
func (w *Waker) unsubscribe(ctx context.Context) {
	if w.conn == nil {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := w.conn.Exec(uctx, "UNLISTEN *"); err != nil {
		w.drop()
	}
}

// drop closes the connection.
func (w *Waker) drop() {
	if w.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = w.conn.Close(ctx)
	cancel()
	w.conn = nil
}

// Close closes the connection; call it after the last Listen returned.
func (w *Waker) Close() { w.drop() }
