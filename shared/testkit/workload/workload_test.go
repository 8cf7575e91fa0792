package workload_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

// TestProducedMessagesAreMeasuredAtTheTarget drives the whole chain by
// hand: producers commit, a claimer counted by the database claims, the
// product's webhook publisher delivers to the target, and the measurement
// finds every message with a latency.
func TestProducedMessagesAreMeasuredAtTheTarget(t *testing.T) {
	t.Parallel()
	const latency = 5 * time.Millisecond
	db := pgtest.New(t)
	ctx := t.Context()
	if err := workload.EnableFunctionStats(ctx, db.Pool, db.Name); err != nil {
		t.Fatal(err)
	}
	ledger := workload.NewLedger()
	produceCtx, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	ps, err := workload.Produce(produceCtx, workload.ProducerConfig{Pool: db.Pool, Rate: 200, MessagesPerTx: 4, Ledger: ledger})
	if err != nil {
		t.Fatal(err)
	}
	var stored int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox.pending`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if ps.Messages == 0 || ps.Messages != int64(ledger.Len()) || ps.Messages != stored || ps.Transactions*4 != ps.Messages {
		t.Fatalf("producers: %+v, ledger %d, table %d", ps, ledger.Len(), stored)
	}

	target, err := workload.StartTarget(latency)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	secret, err := webhook.ParseSecret(target.Secret)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := webhook.New(nil, webhook.Config{URL: target.URL, Secret: secret, Concurrency: 16})
	if err != nil {
		t.Fatal(err)
	}
	claimer, err := pgxpool.New(ctx, db.URL) // new sessions: counted
	if err != nil {
		t.Fatal(err)
	}
	store := lease.NewStore(claimer)
	claims := 0
	for {
		msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "measure", BatchSize: 100, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		claims++
		if len(msgs) == 0 {
			break
		}
		ptrs := make([]*outboxtype.Message, len(msgs))
		for i := range msgs {
			ptrs[i] = &msgs[i]
		}
		for i, r := range pub.Publish(ctx, ptrs) {
			if r.Kind != publish.Delivered {
				t.Fatalf("message %s: %+v", msgs[i].ID, r)
			}
		}
	}
	claimer.Close() // a session's counts are reported when it ends

	m := workload.Measure(ledger, target)
	if m.Committed != int(ps.Messages) || m.Received != m.Committed || m.Missing != 0 || m.Unexpected != 0 || m.Latency.Min < latency {
		t.Errorf("measurement: %+v", m)
	}
	if c := target.Counts(); c.Calls != int64(m.Received) || c.Duplicates != 0 || c.Refused != 0 {
		t.Errorf("target counts %+v for %d messages", c, m.Received)
	}
	if share := m.ShareWithin(m.Latency.Max); share != 1 {
		t.Errorf("ShareWithin(max) = %g", share)
	}
	var counted int64
	deadline := time.Now().Add(10 * time.Second)
	for counted < int64(claims) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		if counted, err = workload.ClaimCalls(ctx, db.Pool); err != nil {
			t.Fatal(err)
		}
	}
	if counted != int64(claims) {
		t.Errorf("the database counted %d claim_batch calls, the claimer made %d", counted, claims)
	}
}

func TestSummarise(t *testing.T) {
	t.Parallel()
	var samples []time.Duration
	for i := 1; i <= 1000; i++ {
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	s := workload.Summarise(samples)
	if s.N != 1000 || s.P50 != 500*time.Millisecond || s.P99 != 990*time.Millisecond || s.P999 != 999*time.Millisecond || s.Max != time.Second || s.Min != time.Millisecond {
		t.Errorf("Summarise: %+v", s)
	}
	if (workload.Summarise(nil) != workload.Summary{}) {
		t.Error("Summarise(nil) is not zero")
	}
}

// TestBulkBacklogArrivesAtTheEventBus loads a bulk backlog, claims it and
// publishes it through the product's EventBridge publisher and a real SDK
// client to the EventBus, which must find every message by the id its
// payload carries, once.
func TestBulkBacklogArrivesAtTheEventBus(t *testing.T) {
	t.Parallel()
	const n = workload.BulkChunk + 1234 // two statements
	db := pgtest.New(t)
	ctx := t.Context()
	ledger := workload.NewLedger()
	if err := workload.CommitBulkBacklog(ctx, db.Pool, ledger, n); err != nil {
		t.Fatal(err)
	}
	var stored, distinct int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT payload->>'id') FILTER (WHERE payload->>'id' = id::text) FROM outbox.pending`).Scan(&stored, &distinct); err != nil {
		t.Fatal(err)
	}
	if ledger.Len() != n || stored != n || distinct != n {
		t.Fatalf("ledger %d, table %d rows, %d carrying their own id; want %d", ledger.Len(), stored, distinct, n)
	}
	var syncCommit string
	if err := db.Pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&syncCommit); err != nil || syncCommit != "on" {
		t.Errorf("a pooled session's synchronous_commit is %q (%v) after the load", syncCommit, err)
	}

	bus, err := workload.StartEventBus()
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	client := awseb.NewFromConfig(aws.Config{
		Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKID", "secret", ""),
		BaseEndpoint: aws.String(bus.URL),
	})
	pub, err := eventbridge.New(client, eventbridge.Config{EventBus: "bench"})
	if err != nil {
		t.Fatal(err)
	}
	store := lease.NewStore(db.Pool)
	published := 0
	for {
		msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "bus", BatchSize: 5000, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			break
		}
		ptrs := make([]*outboxtype.Message, len(msgs))
		for i := range msgs {
			ptrs[i] = &msgs[i]
		}
		// The first batch twice: the bus counts the repeats as duplicates.
		if published == 0 {
			pub.Publish(ctx, ptrs[:10])
		}
		for i, r := range pub.Publish(ctx, ptrs) {
			if r.Kind != publish.Delivered {
				t.Fatalf("message %s: %+v", msgs[i].ID, r)
			}
		}
		published += len(msgs)
	}
	m := workload.Measure(ledger, bus)
	if published != n || m.Received != n || m.Missing != 0 || m.Unexpected != 0 {
		t.Errorf("published %d; measurement %+v", published, m)
	}
	if c := bus.Counts(); c.Duplicates != 10 || c.Refused != 0 || bus.Entries() != int64(n+10) || c.Calls < int64(n/10) {
		t.Errorf("bus counts %+v, %d entries, for %d messages", c, bus.Entries(), n)
	}
}

// TestCPUMeterCountsChildrenAndBackends burns CPU in a child process and
// in a backend of the database, and finds both in the window.
func TestCPUMeterCountsChildrenAndBackends(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	meter := workload.StartCPUMeter(db.Pool, db.Name)
	// A backend busy for about 300 ms of CPU, on a connection of its own.
	worker, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := worker.Exec(ctx, `SELECT count(*) FROM generate_series(1, 3000000) g WHERE md5(g::text) LIKE 'a%'`); err != nil {
		t.Fatal(err)
	}
	// A child process busy for a while.
	if err := exec.CommandContext(ctx, "sh", "-c", `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done`).Run(); err != nil {
		t.Fatal(err)
	}
	used := meter.Stop(ctx, db.Pool, db.Name)
	worker.Close()
	if used.Children <= 0 || !used.DatabaseKnown || used.Database <= 0 || used.Wall <= 0 || used.Cores == 0 || used.Machine < used.Children {
		t.Errorf("CPU window: %+v", used)
	}
}
