package functions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/pgtest"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf/emftest"
)

// The metrics function's documents equal outbox.stats(), parse under the
// EMF rules, and stay bounded with 500 topics.
func TestMetricsExporterMatchesStats(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const topics = 500
	// Topic i gets i%7+1 messages, so that depths differ and rank.
	enqueue(t, db.Pool, topics*4, func(i int) outbox.Message {
		return outbox.Message{Namespace: fmt.Sprintf("ns-%d", i%3), Topic: fmt.Sprintf("topic-%03d", i%topics),
			Payload: json.RawMessage(`{"n":1}`)}
	})
	ctx := context.Background()
	// Some dead letters, leased and expired rows. The lease is long so that
	// only the two rows expired below count as expired, however slowly the
	// metrics function starts on a loaded machine.
	store := lease.NewStore(db.Pool)
	claimed, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 40, Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var results []lease.Result
	for _, m := range claimed[:20] {
		results = append(results, lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: lease.Failed, ErrorCode: "TARGET_REJECTED"})
	}
	if _, err := store.CompleteBatch(ctx, "w", results); err != nil {
		t.Fatal(err)
	}
	db.Pool.Exec(ctx, `UPDATE outbox.pending SET lease_expires_at = now() - interval '1 second' WHERE id = ANY($1)`, []any{claimed[20].ID, claimed[21].ID})

	fn := start(t, "metrics", env(db, "OUTBOX_METRICS_TOP_N=10")...)
	var snap struct {
		Totals struct {
			Pending       int64 `json:"pending"`
			Leased        int64 `json:"leased"`
			ExpiredLeases int64 `json:"expired_leases"`
			Dead          int64 `json:"dead"`
		} `json:"totals"`
		Topics     []lease.TopicStats `json:"topics"`
		Other      *lease.TopicStats  `json:"other"`
		TopicCount int                `json:"topic_count"`
	}
	invoke(t, fn, event(t, "metrics-schedule.json"), 20*time.Second, &snap)

	stats, err := store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pending, dead, leased, expired int64
	for _, s := range stats {
		pending += s.Pending
		dead += s.Dead
		leased += s.Leased
		expired += s.ExpiredLeases
	}
	if snap.TopicCount != len(stats) || snap.Totals.Pending != pending || snap.Totals.Dead != dead ||
		snap.Totals.Leased != leased || snap.Totals.ExpiredLeases != expired || expired != 2 || dead != 20 {
		t.Fatalf("snapshot totals %+v (topics %d), stats say pending %d dead %d leased %d expired %d over %d topics",
			snap.Totals, snap.TopicCount, pending, dead, leased, expired, len(stats))
	}
	if len(snap.Topics) != 10 || snap.Other == nil {
		t.Fatalf("%d topics reported one by one and other=%v, want the top 10 and an aggregate", len(snap.Topics), snap.Other)
	}

	// Every line with "_aws" is a valid EMF document.
	var emfLines []string
	for _, line := range strings.Split(fn.Stdout(), "\n") {
		if strings.Contains(line, `"_aws"`) {
			emfLines = append(emfLines, line)
		}
	}
	docs := emftest.Parse(t, []byte(strings.Join(emfLines, "\n")+"\n"))
	pairs := map[string]bool{}
	var totalPending, perTopicPending float64
	for _, d := range docs {
		ns, hasNS := d.Dimensions["Namespace"]
		mv, ok := d.Metrics["PendingDepth"]
		if !ok {
			continue
		}
		if !hasNS {
			totalPending += mv.Values[0]
			continue
		}
		pairs[ns+"/"+d.Dimensions["Topic"]] = true
		perTopicPending += mv.Values[0]
	}
	if totalPending != float64(pending) || perTopicPending != float64(pending) {
		t.Errorf("EMF PendingDepth: overall %v, sum over topics %v; stats say %d", totalPending, perTopicPending, pending)
	}
	if len(pairs) != 11 || !pairs["(other)/(other)"] {
		t.Errorf("%d namespace/topic dimension values for %d topics, want 10 plus (other): cardinality must stay bounded", len(pairs), topics)
	}
	for _, top := range snap.Topics {
		if !pairs[top.Namespace+"/"+top.Topic] {
			t.Errorf("top topic %s/%s has no metrics", top.Namespace, top.Topic)
		}
	}
}

// No payload field and no password from the connection string reaches the
// logs, even when things go wrong.
func TestLogsNeverCarryPayloadsOrPasswords(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	const canary = "4111-1111-1111-1111-canary"
	const password = "s3cr3t-hunter2"
	// Trust authentication accepts any password, so the URL connects.
	urlWithPassword := strings.Replace(db.URL, "postgres@", "postgres:"+password+"@", 1)
	enqueue(t, db.Pool, 10, func(i int) outbox.Message {
		m := usage(i)
		m.Payload = json.RawMessage(fmt.Sprintf(`{"card":%q,"turn":%d}`, canary, i))
		if i%2 == 0 {
			m.Payload = json.RawMessage(fmt.Sprintf(`{"card":%q,"poison":true}`, canary)) // refused: logged as dead
		}
		if i == 9 {
			m.Namespace = "nowhere" // NO_ROUTE: logged as dead
		}
		return m
	})
	envs := []string{"OUTBOX_DATABASE_URL=" + urlWithPassword, "OUTBOX_TRACING=off", "OUTBOX_LOG_LEVEL=debug",
		"OUTBOX_ROUTES=" + snk.routes(), "SINK_SECRET=" + sinkSecret}
	fn := start(t, "dispatch", envs...)
	var sum dispatchSummary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 20*time.Second, &sum)
	if sum.Dead == 0 {
		t.Fatal("no dead letters: the test would not see error logging")
	}
	// An invocation that fails on the database: its error is logged too.
	db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db.Name)
	db.Pool.Exec(context.Background(), `REVOKE CONNECT ON DATABASE `+db.Name+` FROM PUBLIC`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fn.Invoke(ctx, event(t, "dispatch-schedule.json"), 10*time.Second)
	badStart := start(t, "reaper", "OUTBOX_DATABASE_URL=postgres://outbox:"+password+"@127.0.0.1:1/outbox?connect_timeout=1", "OUTBOX_TRACING=off")
	badStart.ColdStart(20 * time.Second)

	for name, out := range map[string]string{"dispatch stdout": fn.Stdout(), "dispatch stderr": fn.Stderr(), "reaper stdout": badStart.Stdout(), "reaper stderr": badStart.Stderr()} {
		if strings.Contains(out, canary) {
			t.Errorf("%s carries a payload field:\n%s", name, out)
		}
		if strings.Contains(out, password) {
			t.Errorf("%s carries the database password:\n%s", name, out)
		}
	}
	if !strings.Contains(fn.Stdout(), `"message":"message dead-lettered"`) || !strings.Contains(fn.Stdout(), `"code":"TARGET_REJECTED"`) {
		t.Errorf("dead letters were not logged with their code:\n%s", fn.Stdout())
	}
}
