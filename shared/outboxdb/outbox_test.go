// Package outboxdb_test runs the producer API, shared/outbox, against a
// migrated database. The producer API is a module of its own; these tests
// live in the root module because the migrations, pgtest and the dispatcher
// side they check against do, and a nested module importing its parent would
// put the whole dispatcher back into every producer's module graph.
package outboxdb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

func msg(key string) outbox.Message {
	return outbox.Message{
		Namespace: "billing", Topic: "usage_snapshot", TenantID: "tenant-1", DedupeKey: key,
		Payload: json.RawMessage(fmt.Sprintf(`{"key":%q,"tokens":42}`, key)),
	}
}

func TestEnqueueStoresEveryField(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	at := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	m := outbox.Message{
		Namespace: "billing", Topic: "usage_snapshot", TenantID: "tenant-1", DedupeKey: "k-1", OrderingKey: "user-1",
		Payload: json.RawMessage(`{"tokens": 42}`), Headers: map[string]string{"x-request-id": "r-1"},
		TraceHeader: "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1", AvailableAt: at,
	}
	res, err := outbox.Enqueue(ctx, db.Pool, m)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Inserted || res.SequenceID != 1 {
		t.Fatalf("result = %+v, want inserted with sequence 1", res)
	}
	var (
		ns, topic, tenant, dedupe, ordering, trace string
		payload, headers                           map[string]any
		next                                       time.Time
		seq                                        int64
	)
	err = db.Pool.QueryRow(ctx, `SELECT namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id, payload, headers, trace_header, next_attempt_at
		FROM outbox.pending WHERE id = $1`, res.ID).Scan(&ns, &topic, &tenant, &dedupe, &ordering, &seq, &payload, &headers, &trace, &next)
	if err != nil {
		t.Fatal(err)
	}
	if ns != "billing" || topic != "usage_snapshot" || tenant != "tenant-1" || dedupe != "k-1" || ordering != "user-1" || seq != 1 ||
		payload["tokens"] != float64(42) || headers["x-request-id"] != "r-1" || trace != m.TraceHeader || !next.Equal(at) {
		t.Fatalf("stored row differs: %s %s %s %s %s %d %v %v %s %s", ns, topic, tenant, dedupe, ordering, seq, payload, headers, trace, next)
	}
	if res.ID.Version() != 7 {
		t.Errorf("message id %s is UUID version %d, want 7", res.ID, res.ID.Version())
	}
}

func TestDedupeSameIDEvenAfterDelivery(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()

	first, err := outbox.Enqueue(ctx, db.Pool, msg("tenant-1/turn-1/req-1"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := outbox.Enqueue(ctx, db.Pool, msg("tenant-1/turn-1/req-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !first.Inserted || second.Inserted || second.ID != first.ID {
		t.Fatalf("first %+v, second %+v: want one insert and the same id", first, second)
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM outbox.pending"); n != 1 {
		t.Fatalf("pending has %d rows, want 1", n)
	}

	// Deliver it: the row leaves pending, the dedupe key stays.
	store := lease.NewStore(db.Pool)
	claimed, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v, %d messages", err, len(claimed))
	}
	if _, err := store.CompleteBatch(ctx, "w", []lease.Result{{ID: claimed[0].ID, LeaseToken: claimed[0].LeaseToken, Outcome: outboxtype.OutcomeDispatched}}); err != nil {
		t.Fatal(err)
	}
	third, err := outbox.Enqueue(ctx, db.Pool, msg("tenant-1/turn-1/req-1"))
	if err != nil {
		t.Fatal(err)
	}
	if third.Inserted || third.ID != first.ID {
		t.Fatalf("after delivery: %+v, want the original id %s, not inserted", third, first.ID)
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM outbox.pending"); n != 0 {
		t.Fatalf("pending has %d rows after a dedupe hit on a delivered message, want 0", n)
	}

	// Another topic is another key space.
	other := msg("tenant-1/turn-1/req-1")
	other.Topic = "other"
	res, err := outbox.Enqueue(ctx, db.Pool, other)
	if err != nil || !res.Inserted {
		t.Fatalf("same key, other topic: %+v, %v; want inserted", res, err)
	}
}

func TestEnqueueBatchIsOneRoundTripInOrder(t *testing.T) {
	t.Parallel()
	var trips pgtest.RoundTrips
	queries := &pgtest.QueryCounter{}
	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) {
		trips.Install(cfg)
		cfg.ConnConfig.Tracer = queries
		cfg.MaxConns = 1
	})
	ctx := context.Background()

	// Warm the connection's statement cache, as any long-lived process has.
	if _, err := outbox.EnqueueBatch(ctx, db.Pool, []outbox.Message{msg("warm")}); err != nil {
		t.Fatal(err)
	}
	var batch []outbox.Message
	for i := range 500 {
		m := msg(fmt.Sprintf("k-%d", i%250)) // every key twice: the second is a dedupe hit
		if i%3 == 0 {
			m.OrderingKey = "ord-a"
		}
		batch = append(batch, m)
	}
	trips.Reset()
	queries.Reset()
	results, err := outbox.EnqueueBatch(ctx, db.Pool, batch)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(queries.Queries()); got != 1 {
		t.Errorf("EnqueueBatch ran %d queries, want 1", got)
	}
	if got := trips.Count(); got != 1 {
		t.Errorf("EnqueueBatch took %d round trips, want 1", got)
	}
	if len(results) != 500 {
		t.Fatalf("%d results for 500 messages", len(results))
	}
	var lastSeq int64
	for i, r := range results {
		if i < 250 && !r.Inserted {
			t.Fatalf("result %d not inserted", i)
		}
		if i >= 250 {
			if r.Inserted || r.ID != results[i-250].ID {
				t.Fatalf("result %d = %+v, want the dedupe hit of result %d (%s)", i, r, i-250, results[i-250].ID)
			}
			continue
		}
		if batch[i].OrderingKey != "" {
			if r.SequenceID <= lastSeq {
				t.Fatalf("result %d sequence %d not above %d: batch order not kept", i, r.SequenceID, lastSeq)
			}
			lastSeq = r.SequenceID
		}
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM outbox.pending"); n != 251 {
		t.Fatalf("pending has %d rows, want 251", n)
	}
}

// EnqueueBatch's results are the rows' own under every way pgx can run
// the statement: the simple protocol, which a transaction pooler forces,
// returns them as text, the others in binary. Each result's id is the
// pending row's, its sequence the row's (0 without an ordering key), and a
// dedupe hit returns the first id, not inserted.
func TestEnqueueBatchResultsUnderEveryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
			ctx := context.Background()
			batch := []outbox.Message{msg("a"), msg("b"), msg("a"), msg("c")}
			batch[1].OrderingKey, batch[3].OrderingKey = "user-1", "user-1"
			results, err := outbox.EnqueueBatch(ctx, db.Pool, batch)
			if err != nil {
				t.Fatal(err)
			}
			if len(results) != len(batch) {
				t.Fatalf("%d results for %d messages", len(results), len(batch))
			}
			for i, r := range results {
				var seq *int64
				err := db.Pool.QueryRow(ctx, "SELECT sequence_id FROM outbox.pending WHERE id = $1", r.ID).Scan(&seq)
				if err != nil {
					t.Fatalf("result %d: id %s is not a pending row's: %v", i, r.ID, err)
				}
				var want int64 // 0 for a row without a sequence
				if seq != nil {
					want = *seq
				}
				if r.SequenceID != want {
					t.Errorf("result %d: sequence %d, the row's %d", i, r.SequenceID, want)
				}
			}
			if !results[0].Inserted || results[2].Inserted || results[2].ID != results[0].ID {
				t.Errorf("the dedupe hit: %+v for %+v", results[2], results[0])
			}
			if results[1].SequenceID == 0 || results[3].SequenceID <= results[1].SequenceID {
				t.Errorf("ordered sequences %d then %d", results[1].SequenceID, results[3].SequenceID)
			}
			if results[0].ID == uuid.Nil || results[0].ID == results[1].ID {
				t.Errorf("ids %s and %s", results[0].ID, results[1].ID)
			}
		})
	}
}

func TestRejectedEnqueueLeavesTransactionUsable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE invoices (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO invoices VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	bad := []outbox.Message{
		{Namespace: "", Topic: "t", Payload: []byte(`{}`)},
		{Namespace: "n", Topic: "t", Payload: []byte(`"scalar"`)},
		{Namespace: "n", Topic: "t", Payload: []byte(`{"a":"\u0000"}`)},
		{Namespace: "n", Topic: "t", Payload: []byte(`{}`), Headers: map[string]string{"bad name": "v"}},
	}
	for i, m := range bad {
		if _, err := outbox.Enqueue(ctx, tx, m); !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Fatalf("bad message %d: err = %v, want ErrInvalidMessage", i, err)
		}
	}
	_, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{msg("ok-1"), bad[1]})
	var verr *outbox.ValidationError
	if !errors.As(err, &verr) || verr.Index != 1 || verr.Field != "payload" {
		t.Fatalf("batch err = %v, want a ValidationError for message 1's payload", err)
	}
	if _, err := outbox.Enqueue(ctx, tx, msg("ok-2")); err != nil {
		t.Fatalf("valid enqueue after rejections: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after rejections: %v", err)
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM outbox.pending"); n != 1 {
		t.Fatalf("pending has %d rows, want only the valid message", n)
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM invoices"); n != 1 {
		t.Fatalf("invoices has %d rows, want the business row", n)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestTraceHeaderFromTheProducersContext(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	// What aws-lambda-go puts in an invocation's context.
	ctx := context.WithValue(context.Background(), "x-amzn-trace-id", header) //nolint:staticcheck // the runtime's own key
	res, err := outbox.Enqueue(ctx, db.Pool, msg("traced"))
	if err != nil {
		t.Fatal(err)
	}
	explicit := msg("explicit")
	explicit.TraceHeader = "Root=1-00000000-000000000000000000000001;Sampled=0"
	res2, _ := outbox.Enqueue(ctx, db.Pool, explicit)
	hooked, _ := outbox.Producer{TraceHeader: func(context.Context) string { return "Root=1-hook" }}.
		EnqueueBatch(context.Background(), db.Pool, []outbox.Message{msg("hooked")})
	for id, want := range map[any]string{res.ID: header, res2.ID: explicit.TraceHeader, hooked[0].ID: "Root=1-hook"} {
		var got string
		db.Pool.QueryRow(context.Background(), `SELECT trace_header FROM outbox.pending WHERE id = $1`, id).Scan(&got)
		if got != want {
			t.Errorf("message %v stored trace header %q, want %q", id, got, want)
		}
	}
}

// outbox.enqueue is enqueue_batch of one message, but its refusals name it
// and the message index -1, in SQL and in the *ValidationError a Go
// producer gets; a batch's name the batch and the message's position, even
// right after an enqueue in the same transaction.
func TestRefusalsNameTheFunctionCalledAndTheIndex(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()

	type refusal struct{ code, column, detail, prefix string }
	refused := func(t *testing.T, conn interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, sql string) refusal {
		t.Helper()
		_, err := conn.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			t.Fatalf("%s: %v, want a refusal", sql, err)
		}
		prefix, _, _ := strings.Cut(pgErr.Message, ":")
		return refusal{pgErr.Code, pgErr.ColumnName, pgErr.Detail, prefix}
	}
	const (
		badEnqueue = `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}', p_headers => '{"retries": 3}')`
		badBatch   = `SELECT * FROM outbox.enqueue_batch(ARRAY['billing'], ARRAY['usage'], ARRAY['{"n":1}'], p_headers => ARRAY['{"retries": 3}'])`
		good       = `SELECT * FROM outbox.enqueue('billing', 'usage', '{"n":1}')`
	)
	single := refusal{"P7004", "headers", "message index: -1", "outbox.enqueue"}
	batch := refusal{"P7004", "headers", "message index: 0", "outbox.enqueue_batch"}
	if got := refused(t, db.Pool, badEnqueue); got != single {
		t.Errorf("enqueue refused with %+v, want %+v", got, single)
	}
	if got := refused(t, db.Pool, badBatch); got != batch {
		t.Errorf("enqueue_batch of one refused with %+v, want %+v", got, batch)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, good); err != nil {
		t.Fatal(err)
	}
	if got := refused(t, tx, badBatch); got != batch {
		t.Errorf("enqueue_batch after an enqueue in its transaction refused with %+v, want %+v", got, batch)
	}
	tx.Rollback(ctx)

	// A login confined to another namespace.
	producer := pgtest.Connect(t, db.LoginAs(t, "outbox_producer"))
	var login string
	if err := producer.QueryRow(ctx, `SELECT current_user`).Scan(&login); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT outbox.grant_namespace($1, 'reporting')`, login); err != nil {
		t.Fatal(err)
	}
	denied := refusal{"42501", "namespace", "message index: -1", "outbox.enqueue"}
	if got := refused(t, producer, good); got != denied {
		t.Errorf("enqueue into a namespace not granted refused with %+v, want %+v", got, denied)
	}
	denied.detail, denied.prefix = "message index: 1", "outbox.enqueue_batch"
	if got := refused(t, producer, `SELECT * FROM outbox.enqueue_batch(ARRAY['reporting', 'billing'], ARRAY['daily', 'usage'], ARRAY['{}', '{}'])`); got != denied {
		t.Errorf("enqueue_batch into a namespace not granted refused with %+v, want %+v", got, denied)
	}

	// A Go producer whose limits are looser than the database's.
	loose := outbox.Producer{Limits: outbox.Limits{MaxPayloadBytes: 1 << 20}}
	big := msg("big")
	big.Payload = json.RawMessage(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 300_000)))
	for _, c := range []struct {
		name      string
		enqueue   func() error
		wantIndex int
	}{
		{"Enqueue", func() error { _, err := loose.Enqueue(ctx, db.Pool, big); return err }, -1},
		{"EnqueueBatch", func() error {
			_, err := loose.EnqueueBatch(ctx, db.Pool, []outbox.Message{msg("small"), big})
			return err
		}, 1},
	} {
		var verr *outbox.ValidationError
		if err := c.enqueue(); !errors.As(err, &verr) || !verr.InDatabase || verr.Field != "payload" || verr.Index != c.wantIndex {
			t.Errorf("%s of a payload over the database's limit: %v, want the database's refusal of message %d's payload", c.name, err, c.wantIndex)
		}
	}
}
