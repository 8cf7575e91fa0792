package serve_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/serve"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// notifications counts what arrives on the channel until quiet passes
// without one.
func notifications(t *testing.T, conn *pgx.Conn, quiet time.Duration) int {
	t.Helper()
	n := 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		note, err := conn.WaitForNotification(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) || (err != nil && ctx.Err() != nil) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		if note.Channel != serve.Channel || note.Payload != "" {
			t.Errorf("notification %+v, want an empty one on %s", note, serve.Channel)
		}
		n++
	}
}

// The pending_notify trigger costs a producer one notification per
// transaction that inserts into outbox.pending, however many messages it
// enqueues, and none when it rolls back.
func TestTriggerNotifiesOncePerTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	listener := pgtest.Connect(t, db.URL)
	if _, err := listener.Exec(ctx, "LISTEN "+serve.Channel); err != nil {
		t.Fatal(err)
	}
	// A notification is delivered at commit; on a loaded machine it may
	// take a while, so the first is awaited for up to a minute. Later ones are
	// awaited 300ms: a late duplicate would be counted by the next case or
	// the final check instead, never missed entirely.
	const first, quiet = time.Minute, 300 * time.Millisecond
	msg := func(i int) outbox.Message {
		return outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}

	var batch []outbox.Message
	for i := range 100 {
		batch = append(batch, msg(i))
	}
	if _, err := outbox.EnqueueBatch(ctx, db.Pool, batch); err != nil {
		t.Fatal(err)
	}
	if n := notificationsWithin(t, listener, first, quiet); n != 1 {
		t.Errorf("a batch of 100 in one statement: %d notifications, want 1", n)
	}

	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for i := range 10 {
			if _, err := outbox.Enqueue(ctx, tx, msg(i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := notificationsWithin(t, listener, first, quiet); n != 1 {
		t.Errorf("10 enqueues in one transaction: %d notifications, want 1", n)
	}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, tx, msg(0)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := notifications(t, listener, quiet); n != 0 {
		t.Errorf("a rolled-back enqueue: %d notifications, want none", n)
	}
}

// notificationsWithin waits up to first for the first notification, then
// counts more until quiet passes.
func notificationsWithin(t *testing.T, conn *pgx.Conn, first, quiet time.Duration) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), first)
	_, err := conn.WaitForNotification(ctx)
	cancel()
	if err != nil {
		return 0
	}
	return 1 + notifications(t, conn, quiet)
}

func TestNotifyMigrationDownRemovesTheTrigger(t *testing.T) {
	t.Parallel()
	url := pgtest.NewEmpty(t)
	ctx := context.Background()
	m, err := migrations.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, url)
	objects := func() (triggers, functions int) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname = 'pending_notify' AND tgrelid = to_regclass('outbox.pending')`).Scan(&triggers); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname = 'notify_pending' AND pronamespace = to_regnamespace('outbox')`).Scan(&functions); err != nil {
			t.Fatal(err)
		}
		return triggers, functions
	}
	if tr, fn := objects(); tr != 1 || fn != 1 {
		t.Fatalf("after up: %d triggers, %d functions", tr, fn)
	}
	var public bool
	if err := conn.QueryRow(ctx, `SELECT has_function_privilege('public', 'outbox.notify_pending()', 'EXECUTE')`).Scan(&public); err != nil || public {
		t.Errorf("PUBLIC may execute outbox.notify_pending(): %v %v", public, err)
	}
	// The trigger is part of the baseline: migrating down past it removes
	// the trigger and its function with it.
	if _, err := m.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if tr, fn := objects(); tr != 0 || fn != 0 {
		t.Fatalf("after down to 0: %d triggers, %d functions", tr, fn)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if tr, fn := objects(); tr != 1 || fn != 1 {
		t.Fatalf("after up again: %d triggers, %d functions", tr, fn)
	}
}
