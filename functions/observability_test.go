package functions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/emftest"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
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
		results = append(results, lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeFailed, ErrorCode: "TARGET_REJECTED"})
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
	for _, line := range strings.Split(awaitOutput(t, fn, `"queue snapshot"`, 1), "\n") {
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
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 20*time.Second, &sum)
	if sum.Dead == 0 {
		t.Fatal("no dead letters: the test would not see error logging")
	}
	awaitOutput(t, fn, `"dispatch finished"`, 1)
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

// The metrics function's BlockedKeys counts a key blocked in each state
// outbox.blocked_keys() reports — retrying, lease_expired, parked and
// unsettled — each under its topic, and OldestBlockedKeyAgeSeconds is the
// age of whichever has been blocked longest, whatever its state.
func TestMetricsCountBlockedKeysInEveryState(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(db.Pool)
	states := []struct{ state, key, topic, since string }{
		{lease.BlockedRetrying, "acct-retrying", "t-retrying",
			`UPDATE outbox.pending SET failing_since = now() - $2::interval WHERE ordering_key = $1 AND NOT behind`},
		{lease.BlockedLeaseExpired, "acct-lease", "t-lease",
			`UPDATE outbox.pending SET lease_expires_at = now() - $2::interval WHERE ordering_key = $1 AND NOT behind`},
		{lease.BlockedParked, "acct-parked", "t-parked",
			`UPDATE outbox.dead SET failed_at = now() - $2::interval WHERE ordering_key = $1`},
		{lease.BlockedUnsettled, "acct-unsettled", "t-unsettled",
			`UPDATE outbox.unsettled_keys SET since = now() - $2::interval WHERE ordering_key = $1`},
	}
	for _, s := range states {
		enqueue(t, db.Pool, 3, func(i int) outbox.Message {
			return outbox.Message{Namespace: "payments", Topic: s.topic, OrderingKey: s.key, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		})
	}
	heads, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, MaxRun: 1, Lease: time.Hour})
	if err != nil || len(heads) != len(states) {
		t.Fatalf("claimed %d heads (%v), want %d", len(heads), err, len(states))
	}
	complete := func(m outboxtype.Message, r lease.Result) {
		t.Helper()
		r.ID, r.LeaseToken = m.ID, m.LeaseToken
		if _, err := store.CompleteBatch(ctx, "w", []lease.Result{r}); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range heads {
		switch m.OrderingKey {
		case "acct-retrying":
			complete(m, lease.Result{Outcome: outboxtype.OutcomeRetryable, ErrorCode: "TARGET_5XX", RetryAt: time.Now().Add(time.Hour)})
		case "acct-parked":
			complete(m, lease.Result{Outcome: outboxtype.OutcomeFailed, ErrorCode: "TARGET_REJECTED", OnDead: outboxtype.OnDeadPark})
		case "acct-unsettled":
			// Delivered while a producer holds the key's lock: the
			// completion leaves the key without a head and a debt that no
			// claim comes to pay.
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
				t.Fatal(err)
			}
			if _, err := outbox.Enqueue(ctx, tx, outbox.Message{Namespace: "payments", Topic: "t-unsettled", OrderingKey: m.OrderingKey, Payload: json.RawMessage(`{}`)}); err != nil {
				t.Fatal(err)
			}
			complete(m, lease.Result{Outcome: outboxtype.OutcomeDispatched})
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// age makes state i the longest blocked, i+1 hours ago, and every other
	// state a minute ago (i < 0: all of them).
	age := func(i int) {
		t.Helper()
		for j, s := range states {
			since := "1 minute"
			if j == i {
				since = fmt.Sprintf("%d hours", i+1)
			}
			if _, err := db.Pool.Exec(ctx, s.since, s.key, since); err != nil {
				t.Fatal(err)
			}
		}
	}
	age(-1)
	blocked, err := store.BlockedKeys(ctx, "", 0)
	if err != nil || len(blocked) != len(states) {
		t.Fatalf("blocked keys %+v (%v), want one in each of the %d states", blocked, err, len(states))
	}

	fn := start(t, "metrics", env(db)...)
	seen := 0
	for round, oldest := range states {
		age(round)
		var snap struct {
			Totals struct {
				BlockedKeys int64 `json:"blocked_keys"`
			} `json:"totals"`
		}
		invoke(t, fn, event(t, "metrics-schedule.json"), 20*time.Second, &snap)
		// The log line the function writes after its metrics.
		stdout := awaitOutput(t, fn, `"queue snapshot"`, round+1)
		var emfLines []string
		for _, line := range strings.Split(stdout, "\n") {
			if strings.Contains(line, `"_aws"`) {
				emfLines = append(emfLines, line)
			}
		}
		docs := emftest.Parse(t, []byte(strings.Join(emfLines, "\n")+"\n"))[seen:]
		seen += len(docs)
		total, oldestAge := -1.0, -1.0
		perTopic := map[string]float64{}
		for _, d := range docs {
			mv, ok := d.Metrics["BlockedKeys"]
			switch {
			case !ok:
			case d.Dimensions["Topic"] != "":
				perTopic[d.Dimensions["Topic"]] += mv.Values[0]
			default:
				total = mv.Values[0]
				oldestAge = d.Metrics["OldestBlockedKeyAgeSeconds"].Values[0]
			}
		}
		if total != float64(len(states)) || snap.Totals.BlockedKeys != int64(len(states)) {
			t.Errorf("round %d: BlockedKeys %v, snapshot %d; want %d, one key in each state", round, total, snap.Totals.BlockedKeys, len(states))
		}
		for _, s := range states {
			if perTopic[s.topic] != 1 {
				t.Errorf("round %d: BlockedKeys of topic %s = %v, want its %s key", round, s.topic, perTopic[s.topic], s.state)
			}
		}
		if want := float64(round+1) * 3600; oldestAge < want || oldestAge > want+600 {
			t.Errorf("round %d: OldestBlockedKeyAgeSeconds %v, want the %s key's %v", round, oldestAge, oldest.state, want)
		}
	}
}

// awaitOutput waits until the function's standard output holds n complete
// lines containing marker and returns the output up to the n-th: the test
// reads the process's output through a pipe, which may
// lag behind the invocation's answer.
func awaitOutput(t *testing.T, fn *lambdatest.Function, marker string, n int) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := fn.Stdout()
		seen, end := 0, 0
		for i := 0; i < len(out) && seen < n; {
			nl := strings.IndexByte(out[i:], '\n')
			if nl < 0 {
				break
			}
			if strings.Contains(out[i:i+nl], marker) {
				seen++
				end = i + nl + 1
			}
			i += nl + 1
		}
		if seen >= n {
			return out[:end]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines with %s in the function's output after 30s, want %d:\n%s", seen, marker, n, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Each function sets its collector for the function's memory at cold start
// and says so in its cold-start line: a soft limit of four fifths of the
// memory, and a pace of five times the live heap between collections
// (config.GCPercent) under it; and its scheduler for the CPU that memory
// buys: one processor below 1,769 MB (config.MaxProcs). GOGC, GOMEMLIMIT
// and GOMAXPROCS set by the deployer are the runtime's own and stay as
// they are.
func TestColdStartTunesTheCollectorForTheFunctionsMemory(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, tc := range []struct {
		function string
		extra    []string
		gogc     float64
		limitMiB float64
		procs    float64
	}{
		// lambdatest runs every function with 256 MB, the template's size.
		{"dispatch", nil, 400, 204, 1}, // four fifths of 256 MiB, in whole MiB
		{"reaper", nil, 400, 204, 1},   // four fifths of 256 MiB, in whole MiB
		{"dispatch", []string{"GOGC=150", "GOMEMLIMIT=100MiB", "GOMAXPROCS=3"}, 150, 100, 3},
		{"dispatch", []string{"GOGC=off"}, -1, 204, 1}, // four fifths of 256 MiB, in whole MiB
	} {
		t.Run(tc.function+" "+strings.Join(tc.extra, " "), func(t *testing.T) {
			extra := tc.extra
			if tc.function == "dispatch" {
				extra = append(extra, `OUTBOX_ROUTES={"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"eventbridge","event_bus":"default"}}]}`)
			}
			fn := start(t, tc.function, env(db, extra...)...)
			out := awaitOutput(t, fn, `"cold start"`, 1)
			out = strings.TrimSuffix(out, "\n")
			line := out[strings.LastIndex(out, "\n")+1:]
			var got struct {
				GOGC     *float64 `json:"gogc"`
				LimitMiB *float64 `json:"memory_limit_mib"`
				Procs    *float64 `json:"gomaxprocs"`
			}
			if err := json.Unmarshal([]byte(line), &got); err != nil {
				t.Fatalf("cold start line %q: %v", line, err)
			}
			if got.GOGC == nil || got.LimitMiB == nil || *got.GOGC != tc.gogc || *got.LimitMiB != tc.limitMiB {
				t.Errorf("cold start line %s: want gogc %v and memory_limit_mib %v", line, tc.gogc, tc.limitMiB)
			}
			if got.Procs == nil || *got.Procs != tc.procs {
				t.Errorf("cold start line %s: want gomaxprocs %v", line, tc.procs)
			}
		})
	}
}
