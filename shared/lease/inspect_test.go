package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// failAll claims every due message of namespace and completes it FAILED
// with code, as the dispatcher does for a terminal error.
func failAll(t *testing.T, store *lease.Store, namespace, code string) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1000, Lease: time.Minute, Namespaces: []string{namespace}})
	if err != nil {
		t.Fatal(err)
	}
	var results []lease.Result
	var ids []uuid.UUID
	for _, m := range msgs {
		results = append(results, lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeFailed,
			ErrorCode: code, ErrorMessage: "refused: " + m.ID.String(), Target: "t", Latency: 7 * time.Millisecond})
		ids = append(ids, m.ID)
	}
	if _, err := store.CompleteBatch(ctx, "w", results); err != nil {
		t.Fatal(err)
	}
	return ids
}

// ListDead takes the filters of ReplayDead and returns the letters a
// replay with the same filter and limit would move, in its order.
func TestListDeadMatchesWhatReplayWouldMove(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	enqueue(t, db.Pool, 5, func(i int) outbox.Message {
		m := plain(i)
		m.TenantID, m.DedupeKey = "tenant-1", fmt.Sprintf("key-%d", i)
		return m
	})
	rejected := failAll(t, store, "billing", "TARGET_REJECTED")
	enqueue(t, db.Pool, 2, func(i int) outbox.Message {
		m := plain(i)
		m.Namespace = "audit"
		return m
	})
	unrouted := failAll(t, store, "audit", "NO_ROUTE")

	for _, tc := range []struct {
		name   string
		filter lease.DeadFilter
		want   []uuid.UUID
		total  int
	}{
		{"everything", lease.DeadFilter{}, append(slices.Clone(rejected), unrouted...), 7},
		{"by namespace", lease.DeadFilter{Namespace: "audit"}, unrouted, 2},
		{"by code and topic", lease.DeadFilter{ErrorCode: "TARGET_REJECTED", Topic: "usage"}, rejected, 5},
		{"limited", lease.DeadFilter{ErrorCode: "TARGET_REJECTED", Limit: 2}, rejected[:2], 5},
		{"by ids", lease.DeadFilter{MessageIDs: []uuid.UUID{unrouted[1], rejected[3]}}, nil, 2},
		{"failed in the future", lease.DeadFilter{FailedAfter: time.Now().Add(time.Hour)}, []uuid.UUID{}, 0},
		{"failed before now", lease.DeadFilter{FailedBefore: time.Now().Add(time.Hour)}, append(slices.Clone(rejected), unrouted...), 7},
		{"nothing matches", lease.DeadFilter{Namespace: "payments"}, []uuid.UUID{}, 0},
	} {
		got, err := store.ListDead(ctx, tc.filter)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var ids []uuid.UUID
		for _, d := range got.Letters {
			ids = append(ids, d.ID)
		}
		limit := tc.filter.Limit
		if limit == 0 {
			limit = 100 // ListDead's default
		}
		replay := lease.ReplayRequest{
			MessageIDs: tc.filter.MessageIDs, Namespace: tc.filter.Namespace, Topic: tc.filter.Topic,
			ErrorCode: tc.filter.ErrorCode, FailedAfter: tc.filter.FailedAfter, FailedBefore: tc.filter.FailedBefore,
			Limit: limit, DryRun: true,
		}
		wouldMove, err := store.ReplayDead(ctx, replay)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids, wouldMove) && !(len(ids) == 0 && len(wouldMove) == 0) {
			t.Errorf("%s: listed %v, a replay would move %v", tc.name, ids, wouldMove)
		}
		if tc.want != nil && !slices.Equal(ids, tc.want) && !(len(ids) == 0 && len(tc.want) == 0) {
			t.Errorf("%s: listed %v, want %v", tc.name, ids, tc.want)
		}
		if got.Matched != tc.total || got.Letters == nil {
			t.Errorf("%s: matched %d, want %d (letters %v)", tc.name, got.Matched, tc.total, got.Letters)
		}
		if r := replay.Filter(); !slices.Equal(r.MessageIDs, tc.filter.MessageIDs) || r.Namespace != tc.filter.Namespace || r.Limit != replay.Limit {
			t.Errorf("%s: ReplayRequest.Filter() = %+v", tc.name, r)
		}
	}

	all, err := store.ListDead(ctx, lease.DeadFilter{Namespace: "billing", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	d := all.Letters[0]
	if d.ID != rejected[0] || d.TenantID != "tenant-1" || d.DedupeKey != "key-0" || d.AttemptCount != 1 ||
		d.LastErrorCode != "TARGET_REJECTED" || d.LastError != "refused: "+d.ID.String() || d.FailedBy != "w" ||
		time.Since(d.FailedAt) > time.Minute || d.CreatedAt.After(d.FailedAt) {
		t.Errorf("dead letter %+v", d)
	}
	if _, err := store.ListDead(ctx, lease.DeadFilter{Limit: -1}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("a negative limit: %v", err)
	}
}

func TestLookupMessageAndItsAttempts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	res := enqueue(t, db.Pool, 2, func(i int) outbox.Message {
		return outbox.Message{Namespace: "billing", Topic: "usage", TenantID: "t-9", DedupeKey: fmt.Sprintf("k-%d", i),
			OrderingKey: "billing:t-9", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
			Headers: map[string]string{"region": "eu"}, TraceHeader: "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"}
	})
	// The head of the ordering key fails and dies; the next one is pending.
	dead := failAll(t, store, "billing", "INVALID_PAYLOAD")
	if len(dead) != 1 || dead[0] != res[0].ID {
		t.Fatalf("failed %v, want the head %s", dead, res[0].ID)
	}

	m, err := store.LookupMessage(ctx, res[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if m.State != lease.StateDead || m.FailedAt == nil || m.FailedBy != "w" || m.NextAttemptAt != nil ||
		string(m.Payload) != `{"n": 0}` || m.Headers["region"] != "eu" || m.SequenceID != 1 || m.OrderingKey != "billing:t-9" ||
		m.TraceHeader == "" || m.LastErrorCode != "INVALID_PAYLOAD" || m.AttemptCount != 1 {
		t.Errorf("dead message %+v (payload %s)", m, m.Payload)
	}
	p, err := store.LookupMessage(ctx, res[1].ID)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != lease.StatePending || p.NextAttemptAt == nil || p.FailedAt != nil || p.SequenceID != 2 || p.AttemptCount != 0 || p.ClaimedBy != "" {
		t.Errorf("pending message %+v", p)
	}
	if _, err := store.LookupMessage(ctx, uuid.New()); !errors.Is(err, lease.ErrMessageNotFound) {
		t.Errorf("an unknown id: %v", err)
	}

	// Replayed, the dead message has two outcomes, in order, and is pending.
	if _, err := store.ReplayDead(ctx, lease.ReplayRequest{MessageIDs: dead, Limit: 10, Operator: "alice", Reason: "fixed upstream"}); err != nil {
		t.Fatal(err)
	}
	attempts, err := store.MessageAttempts(ctx, res[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(attempts) != 2 || attempts[0].State != "FAILED" || attempts[0].LatencyMS == nil || *attempts[0].LatencyMS != 7 ||
		attempts[0].WorkerID != "w" || attempts[0].Target != "t" || attempts[0].ErrorCode != "INVALID_PAYLOAD" ||
		attempts[1].State != "REPLAYED" || attempts[1].Operator != "alice" || attempts[1].Reason != "fixed upstream" || attempts[1].LatencyMS != nil {
		t.Errorf("attempts %+v", attempts)
	}
	if m, err := store.LookupMessage(ctx, res[0].ID); err != nil || m.State != lease.StatePending {
		t.Errorf("after the replay: %+v %v", m, err)
	}
	none, err := store.MessageAttempts(ctx, uuid.New())
	if err != nil || len(none) != 0 {
		t.Errorf("attempts of an unknown id: %v %v", none, err)
	}
}
