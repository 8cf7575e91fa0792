package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

func topicMessage(namespace, topic string) func(int) outbox.Message {
	return func(i int) outbox.Message {
		return outbox.Message{Namespace: namespace, Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}
}

// retrying claims the due messages of namespace and completes them
// RETRYABLE with code, their next attempt an hour away.
func retrying(t *testing.T, store *lease.Store, namespace, code string) []outboxtype.Message {
	t.Helper()
	ctx := context.Background()
	msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1000, Lease: time.Minute, Namespaces: []string{namespace}})
	if err != nil {
		t.Fatal(err)
	}
	var results []lease.Result
	for _, m := range msgs {
		results = append(results, lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeRetryable,
			ErrorCode: code, ErrorMessage: "HTTP 503 from the target", RetryAt: time.Now().Add(time.Hour)})
	}
	if _, err := store.CompleteBatch(ctx, "w", results); err != nil {
		t.Fatal(err)
	}
	return msgs
}

func claimedTopics(msgs []outboxtype.Message) map[string]int {
	out := map[string]int{}
	for _, m := range msgs {
		out[m.Namespace+"/"+m.Topic]++
	}
	return out
}

func wantRefused(t *testing.T, what string, err error, text string) {
	t.Helper()
	if !errors.Is(err, lease.ErrRefused) || !strings.Contains(err.Error(), text) {
		t.Errorf("%s: %v, want lease.ErrRefused (P7005) saying %q", what, err, text)
	}
}

// A paused namespace's messages, those already queued and those enqueued
// or replayed while it is paused, are not claimed until it is resumed;
// stats() counts them as paused, not due, and not in the oldest age;
// pause and resume are in the operator log with the login; a pause twice,
// or a resume of what is not paused, is refused naming what is.
func TestPauseHoldsANamespaceUntilResumed(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 3, topicMessage("billing", "usage"))
	enqueue(t, db.Pool, 2, topicMessage("billing", "invoice"))
	enqueue(t, db.Pool, 2, topicMessage("audit", "login"))
	dead := failAll(t, store, "audit", "TARGET_REJECTED")
	enqueue(t, db.Pool, 2, topicMessage("audit", "login"))

	n, err := store.Pause(ctx, lease.PauseRequest{Namespace: "billing", Reason: "INC-7: billing endpoint down", Operator: "ana"})
	if err != nil || n != 5 {
		t.Fatalf("pause billing: %d, %v; want the 5 pending messages", n, err)
	}
	enqueue(t, db.Pool, 1, topicMessage("billing", "usage"))
	if _, err := store.Pause(ctx, lease.PauseRequest{Namespace: "audit", Topic: "login", Reason: "noisy", Operator: "bo"}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.ReplayDead(ctx, lease.ReplayRequest{MessageIDs: dead, Limit: 10, Reason: "fixed", Operator: "bo"}); err != nil {
		t.Fatal(err)
	}

	got := claimRun(t, store, "w", 100, 1)
	if len(got) != 0 {
		t.Fatalf("claimed %v while everything is paused", claimedTopics(got))
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE paused`); n != 10 {
		t.Errorf("%d messages marked paused, want all 10 (6 billing; 4 audit/login, 2 of them replayed)", n)
	}
	stats, err := store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.Due != 0 || s.Paused != s.Pending || s.OldestPendingAgeSeconds != 0 {
			t.Errorf("stats %s/%s: due %d, paused %d of %d pending, oldest %.1fs; want all paused, none due or aging",
				s.Namespace, s.Topic, s.Due, s.Paused, s.Pending, s.OldestPendingAgeSeconds)
		}
	}
	pauses, err := store.Pauses(ctx)
	if err != nil || len(pauses) != 2 {
		t.Fatalf("pauses: %+v, %v", pauses, err)
	}
	if p := pauses[0]; p.Namespace != "billing" || p.Topic != lease.AllTopics || p.PausedBy != "ana" || p.DBUser == "" ||
		p.Reason != "INC-7: billing endpoint down" || p.Messages != 6 {
		t.Errorf("the billing pause reads %+v", p)
	}

	_, err = store.Pause(ctx, lease.PauseRequest{Namespace: "billing", Topic: "usage", Reason: "again", Operator: "cy"})
	wantRefused(t, "pause a topic of a paused namespace", err, "billing/* is already paused as a whole, by ana")
	_, err = store.Pause(ctx, lease.PauseRequest{Namespace: "billing", Reason: "again", Operator: "cy"})
	wantRefused(t, "pause billing twice", err, "INC-7: billing endpoint down")
	_, err = store.Resume(ctx, lease.PauseRequest{Namespace: "billing", Topic: "usage", Reason: "fixed", Operator: "ana"})
	wantRefused(t, "resume a topic of a namespace paused whole", err, "billing/usage is not paused; paused there: billing/*")
	_, err = store.Resume(ctx, lease.PauseRequest{Namespace: "payments", Reason: "fixed", Operator: "ana"})
	wantRefused(t, "resume what was never paused", err, "payments/* is not paused")
	if _, err := store.Resume(ctx, lease.PauseRequest{Namespace: "billing", Reason: "", Operator: "ana"}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("resume without a reason: %v, want ErrInvalidArgument", err)
	}

	n, err = store.Resume(ctx, lease.PauseRequest{Namespace: "billing", Reason: "endpoint back", Operator: "ana"})
	if err != nil || n != 6 {
		t.Fatalf("resume billing: %d, %v; want 6", n, err)
	}
	got = claimRun(t, store, "w", 100, 1)
	if c := claimedTopics(got); len(got) != 6 || c["billing/usage"] != 4 || c["billing/invoice"] != 2 {
		t.Errorf("after the resume the claim took %v, want billing's 6 and nothing of audit/login", c)
	}

	var actions []string
	rows, err := db.Pool.Query(ctx, `SELECT action || ' ' || subject || ' ' || operator || ' ' || (db_user = session_user) || ' ' || reason || ' ' || (details->>'messages')
		FROM outbox.operator_log WHERE action IN ('pause', 'resume') ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		actions = append(actions, a)
	}
	want := []string{"pause billing/* ana true INC-7: billing endpoint down 5", "pause audit/login bo true noisy 2", "resume billing/* ana true endpoint back 6"}
	if strings.Join(actions, "\n") != strings.Join(want, "\n") {
		t.Errorf("operator log:\n%s\nwant:\n%s", strings.Join(actions, "\n"), strings.Join(want, "\n"))
	}
}

// A key's messages may span topics: a run stops before a message of a
// paused topic, so the key keeps its order and the rest waits.
func TestPausedTopicStopsAKeysRun(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 4, func(i int) outbox.Message {
		m := ordered("payments", "acct-1")(i)
		m.Topic = []string{"captured", "captured", "refunded", "captured"}[i]
		return m
	})
	if _, err := store.Pause(ctx, lease.PauseRequest{Namespace: "payments", Topic: "refunded", Reason: "refunds on hold", Operator: "ana"}); err != nil {
		t.Fatal(err)
	}
	got := claimRun(t, store, "w", 100, 100)
	if seqs := sequences(got); len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 2 {
		t.Fatalf("claimed sequences %v, want 1 and 2: the run stops before the paused topic", seqs)
	}
	if _, err := store.CompleteBatch(ctx, "w", dispatched(got)); err != nil {
		t.Fatal(err)
	}
	if again := claimRun(t, store, "w", 100, 100); len(again) != 0 {
		t.Fatalf("claimed sequences %v behind a paused head", sequences(again))
	}
	if _, err := store.Resume(ctx, lease.PauseRequest{Namespace: "payments", Topic: "refunded", Reason: "refunds resumed", Operator: "ana"}); err != nil {
		t.Fatal(err)
	}
	if seqs := sequences(claimRun(t, store, "w", 100, 100)); len(seqs) != 2 || seqs[0] != 3 {
		t.Fatalf("after the resume claimed sequences %v, want 3 and 4", seqs)
	}
}

// A paused namespace's backlog is out of the claim index: a claim beside
// 200,000 paused messages, all due before the ones it takes, reads no more
// than beside none.
func TestPausedBacklogCostsTheClaimNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox.pending (id, namespace, topic, payload, payload_bytes, available_at, next_attempt_at)
		SELECT outbox.uuid_v7(), 'billing', 'usage', '{"n":1}', 7, now() - interval '1 hour', now() - interval '1 hour'
		FROM generate_series(1, 200000) g`); err != nil {
		t.Fatal(err)
	}
	store := lease.NewStore(db.Pool)
	if n, err := store.Pause(ctx, lease.PauseRequest{Namespace: "billing", Reason: "backlog on hold", Operator: "ana"}); err != nil || n != 200000 {
		t.Fatalf("pause: %d, %v", n, err)
	}
	// The marked messages' old entries in the claim index are dead until
	// vacuum removes them, as autovacuum does within seconds on this table;
	// until then a claim steps over them.
	if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE outbox.pending`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, 100, topicMessage("audit", "login"))

	got, delta := claimOf100ReadingTuples(ctx, t, db.Pool)
	if c := claimedTopics(got); len(got) != 100 || c["audit/login"] != 100 {
		t.Fatalf("claimed %v, want the 100 audit messages", c)
	}
	if delta > 1000 {
		t.Fatalf("the claim read %d tuples of outbox.pending for 100 messages: it waded through the paused backlog", delta)
	}
	t.Logf("one claim of 100 read %d tuples of outbox.pending beside 200,000 paused messages", delta)
}

// Retry now moves a retrying message's next attempt to now, keeps its
// attempt count and records who, as which login, and why; it refuses the
// whole call for a message it does not apply to, naming each.
func TestRetryNowReschedulesRetryingMessagesOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 2, topicMessage("billing", "usage"))
	failing := retrying(t, store, "billing", "TARGET_5XX")
	enqueue(t, db.Pool, 1, topicMessage("audit", "login"))
	dead := failAll(t, store, "audit", "TARGET_REJECTED")
	later := enqueue(t, db.Pool, 1, func(i int) outbox.Message {
		m := topicMessage("audit", "report")(i)
		m.AvailableAt = time.Now().Add(time.Hour)
		return m
	})
	enqueue(t, db.Pool, 1, topicMessage("audit", "leased"))
	leased := claimRun(t, store, "w", 10, 1)
	if len(leased) != 1 {
		t.Fatalf("claimed %d, want the one due message", len(leased))
	}

	for _, c := range []struct {
		what string
		ids  []uuid.UUID
		text string
	}{
		{"a dead letter", []uuid.UUID{failing[0].ID, dead[0]}, dead[0].String() + " is a dead letter"},
		{"a leased message", []uuid.UUID{leased[0].ID}, "is leased by w until"},
		{"a message scheduled for later that never failed", []uuid.UUID{later[0].ID}, "never failed: its producer scheduled it for"},
		{"an unknown message", []uuid.UUID{uuid.New()}, "is not pending (delivered, discarded, or never enqueued)"},
	} {
		_, err := store.RetryNow(ctx, lease.RetryRequest{MessageIDs: c.ids, Reason: "target fixed", Operator: "ana"})
		wantRefused(t, "retry "+c.what, err, c.text)
	}
	if _, err := store.RetryNow(ctx, lease.RetryRequest{MessageIDs: []uuid.UUID{failing[0].ID}, Operator: "ana"}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("retry without a reason: %v, want ErrInvalidArgument", err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE next_attempt_at <= now() AND last_error_code IS NOT NULL`); n != 0 {
		t.Fatalf("a refused call rescheduled %d messages", n)
	}

	moved, err := store.RetryNow(ctx, lease.RetryRequest{MessageIDs: []uuid.UUID{failing[0].ID, failing[1].ID}, Reason: "target fixed", Operator: "ana"})
	if err != nil || len(moved) != 2 || moved[0].PreviousAttemptAt.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("retry now: %+v, %v", moved, err)
	}
	got := claimRun(t, store, "w2", 10, 1)
	if len(got) != 2 || got[0].Attempt != 2 || got[1].Attempt != 2 {
		t.Fatalf("after retry now the claim took %d messages (attempts %v), want both on their second attempt", len(got), got)
	}
	var state, operator, reason, note string
	var sameLogin bool
	if err := db.Pool.QueryRow(ctx, `SELECT state, operator, reason, db_user = session_user, note FROM outbox.attempts
		WHERE message_id = $1 ORDER BY id DESC LIMIT 1`, failing[0].ID).Scan(&state, &operator, &reason, &sameLogin, &note); err != nil {
		t.Fatal(err)
	}
	if state != "RESCHEDULED" || operator != "ana" || reason != "target fixed" || !sameLogin || !strings.HasPrefix(note, "next attempt moved from") {
		t.Errorf("the audit row reads %s %s %q login:%v %q", state, operator, reason, sameLogin, note)
	}

	// The dispatcher's retention keeps it, as every operator's action.
	if _, err := store.CompleteBatch(ctx, "w2", dispatched(got)); err != nil {
		t.Fatal(err)
	}
	age(t, db.Pool, 48*time.Hour)
	if _, err := store.Purge(ctx, lease.PurgeParams{AttemptsOlderThan: time.Hour, MaxRows: 1000}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'RESCHEDULED'`); n != 2 {
		t.Errorf("the retention purge left %d of the 2 RESCHEDULED rows", n)
	}
	// A message that never failed but is due already is taken along: the
	// operator asked for it now, and now it goes.
	due := enqueue(t, db.Pool, 1, topicMessage("audit", "due"))
	if moved, err := store.RetryNow(ctx, lease.RetryRequest{MessageIDs: []uuid.UUID{due[0].ID}, Reason: "send it", Operator: "ana"}); err != nil || len(moved) != 1 {
		t.Fatalf("retry now of a due message that never failed: %+v, %v; want it taken along", moved, err)
	}
}

// Purging dead letters takes only those older than the window (at least a
// day), oldest first, at most max rows, each audited as DISCARDED, the
// purge in the operator log with its counts; a parked key goes on.
func TestPurgeDeadTakesOnlyOldLetters(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 3, topicMessage("billing", "usage"))
	old := failAll(t, store, "billing", "TARGET_REJECTED")
	enqueue(t, db.Pool, 2, ordered("payments", "acct-1"))
	msgs := claimRun(t, store, "w", 10, 1)
	if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken,
		Outcome: outboxtype.OutcomeFailed, ErrorCode: "TARGET_REJECTED", OnDead: outboxtype.OnDeadPark}}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.dead SET failed_at = now() - interval '40 days'`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, 1, topicMessage("billing", "usage"))
	young := failAll(t, store, "billing", "TARGET_REJECTED")

	if _, err := store.PurgeDead(ctx, lease.PurgeDeadRequest{OlderThan: 23 * time.Hour, MaxRows: 10, Reason: "retention", Operator: "ana"}); !errors.Is(err, lease.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "at least 1 day") {
		t.Errorf("purge below a day: %v", err)
	}
	res, err := store.PurgeDead(ctx, lease.PurgeDeadRequest{OlderThan: 30 * 24 * time.Hour, Namespace: "billing", MaxRows: 2, Reason: "30-day retention", Operator: "ana"})
	if err != nil || res.Purged != 2 || res.Remaining != 1 {
		t.Fatalf("purge billing, 2 at most: %+v, %v; want 2 purged, 1 remaining", res, err)
	}
	res, err = store.PurgeDead(ctx, lease.PurgeDeadRequest{OlderThan: 30 * 24 * time.Hour, MaxRows: 100, Reason: "30-day retention", Operator: "ana"})
	if err != nil || res.Purged != 2 || res.Remaining != 0 {
		t.Fatalf("purge the rest: %+v, %v; want the last billing letter and the parked head", res, err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead`); n != 1 || count(t, db.Pool, `SELECT count(*) FROM outbox.dead WHERE id = $1`, young[0]) != 1 {
		t.Errorf("%d dead letters left, want only the young one", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISCARDED' AND operator = 'ana'
		AND reason = '30-day retention' AND db_user = session_user AND note LIKE 'purged: dead since %' AND message_id = ANY($1)`, old); n != 3 {
		t.Errorf("%d of the 3 purged billing letters audited as DISCARDED", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.operator_log WHERE action = 'purge_dead' AND operator = 'ana'
		AND (details->>'purged')::int = 2`); n != 2 {
		t.Errorf("%d purge_dead entries in the operator log with their counts, want 2", n)
	}
	// The parked key's next message goes.
	if next := claimRun(t, store, "w", 10, 1); len(next) != 1 || next[0].SequenceID != 2 {
		t.Errorf("after its parked head was purged the key's claim took %v", sequences(next))
	}
}

// pending list shows where each message stands and, behind a key's head,
// what it waits on; the filters combine.
func TestListPendingSaysWhatEachMessageWaitsFor(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 3, ordered("payments", "acct-1"))
	head := retrying(t, store, "payments", "TARGET_5XX")
	enqueue(t, db.Pool, 2, topicMessage("billing", "usage"))
	if _, err := store.Pause(ctx, lease.PauseRequest{Namespace: "billing", Topic: "usage", Reason: "hold", Operator: "ana"}); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, 1, topicMessage("audit", "login"))

	all, err := store.ListPending(ctx, lease.PendingFilter{})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]int{}
	for _, m := range all.Messages {
		states[m.Namespace+" "+m.State]++
		if m.State == lease.PendingBehind {
			w := m.WaitsBehind
			if w == nil || w.ID == nil || *w.ID != head[0].ID || w.SequenceID != 1 || w.State != lease.PendingRetrying || w.ErrorCode != "TARGET_5XX" {
				t.Errorf("sequence %d waits behind %+v, want the retrying head %s", m.SequenceID, w, head[0].ID)
			}
		} else if m.WaitsBehind != nil {
			t.Errorf("%s message %s waits behind %+v", m.State, m.ID, m.WaitsBehind)
		}
	}
	want := map[string]int{"payments retrying": 1, "payments behind": 2, "billing paused": 2, "audit due": 1}
	if fmt.Sprint(states) != fmt.Sprint(want) || all.Matched != 6 {
		t.Errorf("states %v (%d matched), want %v", states, all.Matched, want)
	}
	if r := all.Messages[0]; r.ID != head[0].ID || r.LastErrorCode != "TARGET_5XX" || r.LastError == "" || r.AttemptCount != 1 {
		t.Errorf("the first listed, the longest available, is %+v; want the retrying head with its error", r)
	}

	for _, c := range []struct {
		what string
		f    lease.PendingFilter
		want int
	}{
		{"retrying", lease.PendingFilter{Retrying: true}, 1},
		{"blocked", lease.PendingFilter{Blocked: true}, 3},
		{"namespace and topic", lease.PendingFilter{Namespace: "billing", Topic: "usage"}, 2},
		{"ordering key", lease.PendingFilter{Namespace: "payments", OrderingKey: "acct-1"}, 3},
		{"older than an hour", lease.PendingFilter{OlderThan: time.Hour}, 0},
		{"limit", lease.PendingFilter{Limit: 2}, 2},
		{"ids", lease.PendingFilter{MessageIDs: []uuid.UUID{head[0].ID}}, 1},
	} {
		got, err := store.ListPending(ctx, c.f)
		if err != nil || len(got.Messages) != c.want {
			t.Errorf("%s: %d messages (%v), want %d", c.what, len(got.Messages), err, c.want)
		}
	}
	if _, err := store.ListPending(ctx, lease.PendingFilter{Limit: 10001}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("limit 10001: %v, want ErrInvalidArgument", err)
	}
}

// A message being delivered when its namespace is paused finishes its
// attempt; retried, it waits for the resume. A resume takes every paused
// message, also one a transaction held while it ran.
func TestPauseTakesLeasedMessagesAndResumeTakesHeldOnes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 2, topicMessage("billing", "usage"))
	leased := claimRun(t, store, "w", 1, 1)
	if n, err := store.Pause(ctx, lease.PauseRequest{Namespace: "billing", Reason: "hold", Operator: "ana"}); err != nil || n != 2 {
		t.Fatalf("pause: %d, %v; want both messages, the leased one too", n, err)
	}
	if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: leased[0].ID, LeaseToken: leased[0].LeaseToken,
		Outcome: outboxtype.OutcomeRetryable, ErrorCode: "TIMEOUT", RetryAt: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if got := claimRun(t, store, "w", 10, 1); len(got) != 0 {
		t.Fatalf("claimed %d paused messages, the retried one among them?", len(got))
	}

	// Another transaction holds one of the paused rows while the resume runs.
	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT 1 FROM outbox.pending WHERE id = $1 FOR UPDATE`, leased[0].ID); err != nil {
		t.Fatal(err)
	}
	resumed := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = store.Resume(ctx, lease.PauseRequest{Namespace: "billing", Reason: "back", Operator: "ana"})
		resumed <- err
	}()
	// The resume takes the free row and comes back, in rounds, for the
	// held one: let the holder go once the resume is seen running.
	for count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND state = 'active' AND query LIKE '%outbox.resume%' AND pid <> pg_backend_pid()`) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-resumed; err != nil || n != 2 {
		t.Fatalf("resume: %d, %v; want both", n, err)
	}
	if got := claimRun(t, store, "w", 10, 1); len(got) != 2 {
		t.Fatalf("after the resume the claim took %d, want 2", len(got))
	}
}
