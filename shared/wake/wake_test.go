package wake_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/wake"
)

// noPoll is a poll interval no test reaches: only a notification can end
// a Wait.
const noPoll = time.Hour

func enqueue(t *testing.T, db *pgtest.DB) {
	t.Helper()
	if _, err := outbox.Enqueue(t.Context(), db.Pool, outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
}

// waitFor is Wait bounded so that a broken waker fails the test instead of
// hanging it.
func waitFor(t *testing.T, w *wake.Waker, bound time.Duration) wake.Cause {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	return w.Wait(ctx)
}

// A commit wakes a listening waker; the subscription is ended between two
// Listen calls but the connection is kept, so that a lingering invocation
// opens one connection per cold start, not one per invocation, and a frozen
// environment holds no subscription.
func TestCommitWakesAListeningWaker(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var connects atomic.Int32
	w, err := wake.New(wake.Config{PollInterval: noPoll, Connect: func(ctx context.Context) (*pgx.Conn, error) {
		connects.Add(1)
		return pgx.Connect(ctx, db.URL)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for round := range 2 {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); w.Listen(ctx) }()
		// The (re)subscription's catch-up wake-up comes first.
		if got := waitFor(t, w, 30*time.Second); got != wake.Notified {
			t.Fatalf("round %d: the subscription's catch-up: %v, want Notified", round, got)
		}
		enqueue(t, db)
		if got := waitFor(t, w, 30*time.Second); got != wake.Notified {
			t.Fatalf("round %d: after a commit: %v, want Notified", round, got)
		}
		cancel()
		<-done
		if w.Subscribed() {
			t.Errorf("round %d: still subscribed after Listen returned", round)
		}
	}
	c := w.Counts()
	if connects.Load() != 1 || c.Reconnects != 0 || c.Subscriptions != 2 || c.NotifyWakeups != 4 || c.Polls != 0 {
		t.Errorf("%d connections, counts %+v: want one connection, two subscriptions, four notified wake-ups", connects.Load(), c)
	}
}

// Without a subscription the waker polls at PollInterval; with one, at
// ListeningPollInterval.
func TestPollIntervalsFollowTheSubscription(t *testing.T) {
	t.Parallel()
	w, err := wake.New(wake.Config{PollInterval: 20 * time.Millisecond, ListeningPollInterval: noPoll})
	if err != nil {
		t.Fatal(err)
	}
	w.Listen(t.Context()) // no Connect: returns at once
	for range 3 {
		if got := waitFor(t, w, 30*time.Second); got != wake.Polled {
			t.Fatalf("Wait without a subscription: %v, want Polled", got)
		}
	}
	if c := w.Counts(); c.Polls != 3 || c.NotifyWakeups != 0 {
		t.Errorf("counts %+v", c)
	}
	if _, err := wake.New(wake.Config{}); err == nil {
		t.Error("a waker without a poll interval was built")
	}
}

// Notifications arriving while nobody waits leave one wake-up, not one per
// notification.
func TestWakeupsCoalesce(t *testing.T) {
	t.Parallel()
	w, err := wake.New(wake.Config{PollInterval: 50 * time.Millisecond, Debounce: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		w.Notify()
	}
	if got := waitFor(t, w, 30*time.Second); got != wake.Notified {
		t.Fatalf("first Wait: %v, want Notified", got)
	}
	if got := waitFor(t, w, 30*time.Second); got != wake.Polled {
		t.Fatalf("second Wait: %v, want Polled: ten notifications left more than one wake-up", got)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if got := w.Wait(ctx); got != wake.Stopped {
		t.Errorf("Wait on an ended context: %v", got)
	}
}
