package lease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// blockedKeyCase is an ordering key left blocked in one state, on a topic
// of its own, blocked since age ago.
type blockedKeyCase struct {
	state string
	key   string
	topic string
	age   time.Duration
	// waiting is how many of the key's messages wait behind the one it
	// waits on: of three, an unsettled key has delivered its first.
	waiting int64
}

// The four states blocked_keys() reports, each the oldest in turn when
// listed in this order.
var blockedKeyCases = []blockedKeyCase{
	{lease.BlockedUnsettled, "acct-unsettled", "t-unsettled", 4 * time.Hour, 1},
	{lease.BlockedParked, "acct-parked", "t-parked", 3 * time.Hour, 2},
	{lease.BlockedLeaseExpired, "acct-lease", "t-lease", 2 * time.Hour, 2},
	{lease.BlockedRetrying, "acct-retrying", "t-retrying", time.Hour, 2},
}

// blockKeys leaves one key blocked in each state of blockedKeyCases, three
// messages on each, the way the state machine leaves them, then dates each
// blocking back by its age. Beside them, debts to settle that block
// nothing: on a key with a healthy head, and on the retrying key, which
// must still count once. It returns the message each blocked key waits on.
func blockKeys(t *testing.T, db *pgtest.DB) map[string]outboxtype.Message {
	t.Helper()
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	msg := func(key, topic string) func(int) outbox.Message {
		return func(i int) outbox.Message {
			return outbox.Message{Namespace: "payments", Topic: topic, OrderingKey: key, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		}
	}
	for _, c := range blockedKeyCases {
		enqueue(t, db.Pool, 3, msg(c.key, c.topic))
	}
	enqueue(t, db.Pool, 3, msg("acct-healthy", "t-healthy"))
	heads := map[string]outboxtype.Message{}
	for _, m := range claimRun(t, store, "w", 100, 1) {
		heads[m.OrderingKey] = m
	}
	complete := func(m outboxtype.Message, r lease.Result) {
		t.Helper()
		r.ID, r.LeaseToken = m.ID, m.LeaseToken
		if _, err := store.CompleteBatch(ctx, "w", []lease.Result{r}); err != nil {
			t.Fatal(err)
		}
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	since := func(d time.Duration) string { return fmt.Sprintf("%d seconds", int(d.Seconds())) }
	waitsOn := map[string]outboxtype.Message{}
	for _, c := range blockedKeyCases {
		head := heads[c.key]
		switch c.state {
		case lease.BlockedRetrying:
			complete(head, lease.Result{Outcome: outboxtype.OutcomeRetryable, ErrorCode: "TARGET_5XX", RetryAt: time.Now().Add(time.Hour)})
			exec(`UPDATE outbox.pending SET failing_since = now() - $2::interval WHERE id = $1`, head.ID, since(c.age))
			waitsOn[c.key] = head
		case lease.BlockedLeaseExpired:
			exec(`UPDATE outbox.pending SET lease_expires_at = now() - $2::interval WHERE id = $1`, head.ID, since(c.age))
			waitsOn[c.key] = head
		case lease.BlockedParked:
			complete(head, lease.Result{Outcome: outboxtype.OutcomeFailed, ErrorCode: "TARGET_REJECTED", OnDead: outboxtype.OnDeadPark})
			exec(`UPDATE outbox.dead SET failed_at = now() - $2::interval WHERE id = $1`, head.ID, since(c.age))
			waitsOn[c.key] = head
		case lease.BlockedUnsettled:
			// A producer holds the key's lock (its settle ran at once, and
			// its transaction is still open) while the head is delivered:
			// the completion cannot settle the key and leaves it a debt,
			// and no claim comes to pay it. The producer then rolls back.
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
				t.Fatal(err)
			}
			if _, err := outbox.Enqueue(ctx, tx, msg(c.key, c.topic)(99)); err != nil {
				t.Fatal(err)
			}
			complete(head, lease.Result{Outcome: outboxtype.OutcomeDispatched})
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if n := count(t, db.Pool, `SELECT count(*) FROM outbox.unsettled_keys WHERE ordering_key = $1`, c.key); n != 1 {
				t.Fatalf("%d debts recorded for %s, want the completion's 1", n, c.key)
			}
			exec(`UPDATE outbox.unsettled_keys SET since = now() - $2::interval WHERE ordering_key = $1`, c.key, since(c.age))
			waitsOn[c.key] = nextInLine(t, db.Pool, c.key)
		}
	}
	complete(heads["acct-healthy"], lease.Result{Outcome: outboxtype.OutcomeReleased})
	exec(`INSERT INTO outbox.unsettled_keys (namespace, ordering_key, since) VALUES
		('payments', 'acct-healthy', now() - interval '5 hours'), ('payments', 'acct-retrying', now() - interval '5 hours')`)
	return waitsOn
}

// nextInLine reads the message next in line on a headless key: its lowest
// pending sequence.
func nextInLine(t *testing.T, pool *pgxpool.Pool, key string) outboxtype.Message {
	t.Helper()
	var m outboxtype.Message
	if err := pool.QueryRow(context.Background(), `SELECT id, sequence_id FROM outbox.pending WHERE ordering_key = $1
		ORDER BY sequence_id LIMIT 1`, key).Scan(&m.ID, &m.SequenceID); err != nil {
		t.Fatal(err)
	}
	return m
}

// A blocked key is one thing: blocked_keys() lists each key that cannot
// move once, in the state that holds it — retrying, lease_expired, parked
// or unsettled — and stats() counts exactly those keys, each under the topic
// of the message it waits on, with its age. A debt to settle on a key that
// has a head blocks nothing.
func TestStatsCountTheKeysBlockedKeysLists(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	waitsOn := blockKeys(t, db)

	blocked, err := store.BlockedKeys(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocked) != len(blockedKeyCases) {
		t.Fatalf("%d blocked keys listed, want %d: %+v", len(blocked), len(blockedKeyCases), blocked)
	}
	for i, c := range blockedKeyCases { // oldest first
		b := blocked[i]
		want := waitsOn[c.key]
		if b.OrderingKey != c.key || b.State != c.state || b.Topic != c.topic || b.MessageID != want.ID || b.SequenceID != want.SequenceID {
			t.Errorf("blocked key %d: %s %s on %s, message %s seq %d; want %s %s on %s, message %s seq %d",
				i, b.OrderingKey, b.State, b.Topic, b.MessageID, b.SequenceID, c.key, c.state, c.topic, want.ID, want.SequenceID)
		}
		if age := time.Since(b.Since); age < c.age || age > c.age+10*time.Minute {
			t.Errorf("%s blocked since %s ago, want %s", c.key, age.Round(time.Second), c.age)
		}
		if b.Waiting != c.waiting {
			t.Errorf("%s: %d waiting, want the %d messages behind the one it waits on", c.key, b.Waiting, c.waiting)
		}
	}

	stats, err := store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byTopic := map[string]lease.TopicStats{}
	for _, s := range stats {
		byTopic[s.Topic] = s
	}
	for _, c := range blockedKeyCases {
		s := byTopic[c.topic]
		if s.BlockedKeys != 1 {
			t.Errorf("stats count %d blocked keys on %s, want its %s key", s.BlockedKeys, c.topic, c.state)
		}
		if age := time.Duration(s.OldestBlockedKeyAgeSeconds * float64(time.Second)); age < c.age || age > c.age+10*time.Minute {
			t.Errorf("stats say %s's oldest blocked key (%s) is %s old, want %s", c.topic, c.state, age.Round(time.Second), c.age)
		}
	}
	if s := byTopic["t-healthy"]; s.BlockedKeys != 0 {
		t.Errorf("stats count %d blocked keys on t-healthy, whose key has a head", s.BlockedKeys)
	}
}
