package outboxdb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// FuzzEnqueue builds messages from fuzz input and enqueues them against a
// real database, in a transaction of the test's own — as a producer does,
// next to its business change — alone (Enqueue) or in a batch with valid
// neighbours or a copy of itself (EnqueueBatch). Whatever the input:
//
//   - no panic;
//   - a clear result: either an error wrapping outbox.ErrInvalidMessage
//     that names the offending message's index and field, or one result per
//     message;
//   - a rejected message or batch writes nothing (no pending, dedupe or
//     sequence row) and leaves the caller's transaction usable: the
//     business change goes on, and a valid message enqueues after it;
//   - an accepted message is stored as given (keys, headers, trace header,
//     sequence ids 1, 2, … per ordering key; a dedupe key repeated in the
//     batch answers the first message's id and writes nothing).
//
// The transaction is rolled back after each input, so the database stays
// empty and every input sees the same state.
func FuzzEnqueue(f *testing.F) {
	type seed struct {
		ns, topic, payload, tenant, dedupe, ordering, hName, hValue, trace string
		availableAt                                                        int64
		mode, pos                                                          uint8
	}
	for _, s := range []seed{
		{"billing", "usage_snapshot", `{"tokens":42}`, "tenant-1", "tenant-1/turn-7/req-1", "", "x-request-id", "r-1", "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1", 0, 0, 0},
		{"payments", "transfer", `[1,2,3]`, "", "", "acct-7", "", "", "", 0, 1, 2},
		{"payments", "transfer", `{"a":{"b":[null,true,1.5e10]}}`, "", "k", "acct-7", "", "", "", 0, 2, 0},
		{"n", "t", `{}`, "", "", "", "", "", "", 1_900_000_000, 3, 1},
		// Each of these is refused, by a field the validation must name.
		{"", "t", `{}`, "", "", "", "", "", "", 0, 0, 0},
		{"ns with space", "t", `{}`, "", "", "", "", "", "", 0, 1, 1},
		{"n", "*", `{}`, "", "", "", "", "", "", 0, 0, 0},
		{"n", "t", `"a string"`, "", "", "", "", "", "", 0, 0, 0},
		{"n", "t", `{"a":`, "", "", "", "", "", "", 0, 1, 0},
		{"n", "t", `{"nul":"\u0000"}`, "", "", "", "", "", "", 0, 1, 3},
		{"n", "t", `{"s":"\udc00"}`, "", "", "", "", "", "", 0, 0, 0},
		{"n", "t", "{\"bad\":\"\xff\"}", "", "", "", "", "", "", 0, 0, 0},
		{"n", "t", `{}`, "tenant\x00", "", "", "", "", "", 0, 0, 0},
		{"n", "t", `{}`, "", "key\nnext", "", "", "", "", 0, 1, 0},
		{"n", "t", `{}`, "", "", "", "Content-Type", "text/plain", "", 0, 0, 0},
		{"n", "t", `{}`, "", "", "", "x-ok", "bad\r\nvalue", "", 0, 0, 0},
		{"n", "t", `{}`, "", "", "", "", "", "Root=1 2", 0, 0, 0},
		{"n", "t", `[1e131071]`, "", "", "", "", "", "", 0, 1, 0},
		{"n", "t", `{"a":1e999,"a":[1.50e1, -0e-3, "é\/"]}`, "", "", "", "", "", "", 0, 0, 0},
		{"n", "t", `{"big":1e400}`, "", "", "", "", "", "", 0, 0, 0},
		{"n", "t", `{}`, "", "", "", "", "", "", 9_400_000_000_000, 0, 0},   // year ~300000
		{"n", "t", `{}`, "", "", "", "", "", "", 1 << 62, 1, 0},             // beyond int64 microseconds
		{"n", "t", `{"amount":1e1000000}`, "", "", "", "", "", "", 0, 0, 0}, // beyond numeric
		{"n", "t", `{"deep":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`, "", "", "", "", "", "", 0, 2, 0},
	} {
		f.Add(s.ns, s.topic, []byte(s.payload), s.tenant, s.dedupe, s.ordering, s.hName, s.hValue, s.trace, s.availableAt, s.mode, s.pos)
	}
	db := pgtest.New(f)
	ctx := context.Background()
	// The producer's own table: each input's transaction writes one row to
	// it, next to the enqueue, and rolls back.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE business (n int)`); err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, ns, topic string, payload []byte, tenant, dedupe, ordering, hName, hValue, trace string,
		availableAt int64, mode, pos uint8) {
		m := outbox.Message{
			Namespace: ns, Topic: topic, Payload: payload, TenantID: tenant, DedupeKey: dedupe,
			OrderingKey: ordering, TraceHeader: trace,
		}
		if hName != "" {
			m.Headers = map[string]string{hName: hValue}
		}
		if availableAt != 0 {
			m.AvailableAt = time.Unix(availableAt, 0)
		}
		// mode 0: Enqueue; 1: a batch of valid neighbours with m at pos;
		// 2: m twice in a batch; 3: Enqueue, after a rejected message.
		var batch []outbox.Message
		at := -1
		switch mode % 4 {
		case 1:
			n := 2 + int(pos%4)
			at = int(pos) % n
			for i := range n {
				batch = append(batch, filler(i))
			}
			batch[at] = m
		case 2:
			at, batch = 0, []outbox.Message{m, m}
		}

		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		// The business change the message belongs to.
		if _, err := tx.Exec(ctx, `INSERT INTO business VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		if mode%4 == 3 {
			if _, err := outbox.Enqueue(ctx, tx, outbox.Message{Namespace: "n", Topic: "t", Payload: []byte(`"refused"`)}); !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("a string payload was not refused: %v", err)
			}
		}

		var results []outbox.Enqueued
		if batch == nil {
			var r outbox.Enqueued
			if r, err = outbox.Enqueue(ctx, tx, m); err == nil {
				results = []outbox.Enqueued{r}
			}
			batch = []outbox.Message{m}
			at = -1
		} else {
			results, err = outbox.EnqueueBatch(ctx, tx, batch)
		}

		if err != nil {
			var verr *outbox.ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("the database refused what validation accepted (%T: %v): the caller's transaction is %s",
					err, err, txState(ctx, tx))
			}
			if verr.Field == "" || verr.Reason == "" {
				t.Fatalf("validation error without a field or reason: %+v", verr)
			}
			if at >= 0 && verr.Index != at {
				t.Fatalf("the error names message %d, the invalid one is %d: %v", verr.Index, at, err)
			}
			if at < 0 && verr.Index != -1 {
				t.Fatalf("a single enqueue's error names index %d: %v", verr.Index, err)
			}
			if n := rowsWritten(ctx, t, tx); n != 0 {
				t.Fatalf("a refused enqueue wrote %d rows: %v", n, err)
			}
			// The caller's transaction goes on: its business change is
			// there, and a valid message still enqueues.
			var business int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM business`).Scan(&business); err != nil || business != 1 {
				t.Fatalf("the business change after a refused enqueue: %d rows, %v", business, err)
			}
			if _, err := outbox.Enqueue(ctx, tx, filler(0)); err != nil {
				t.Fatalf("a valid enqueue after a refused one: %v", err)
			}
			return
		}

		if len(results) != len(batch) {
			t.Fatalf("%d results for %d messages", len(results), len(batch))
		}
		inserted := 0
		seqs := map[string]int64{}
		firstByKey := map[string]int{}
		for i, r := range results {
			msg := batch[i]
			key := ""
			if msg.DedupeKey != "" {
				key = msg.Namespace + "\x00" + msg.Topic + "\x00" + msg.DedupeKey
			}
			if first, dup := firstByKey[key]; key != "" && dup {
				if r.Inserted || r.ID != results[first].ID || r.SequenceID != results[first].SequenceID {
					t.Fatalf("message %d repeats the dedupe key of message %d: %+v, want the first's %+v", i, first, r, results[first])
				}
				continue
			}
			if key != "" {
				firstByKey[key] = i
			}
			if !r.Inserted || r.ID.Version() != 7 {
				t.Fatalf("message %d: %+v, want inserted with a v7 id", i, r)
			}
			inserted++
			wantSeq := int64(0)
			if msg.OrderingKey != "" {
				seqs[msg.OrderingKey]++
				wantSeq = seqs[msg.OrderingKey]
			}
			if r.SequenceID != wantSeq {
				t.Fatalf("message %d: sequence id %d, want %d", i, r.SequenceID, wantSeq)
			}
			checkStored(ctx, t, tx, r, msg)
		}
		if n := countIn(ctx, t, tx, `SELECT count(*) FROM outbox.pending`); n != inserted {
			t.Fatalf("%d pending rows for %d messages inserted", n, inserted)
		}
	})
}

func filler(i int) outbox.Message {
	return outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
}

func countIn(ctx context.Context, t *testing.T, tx pgx.Tx, sql string) int {
	t.Helper()
	var n int
	if err := tx.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v (the transaction is %s)", sql, err, txState(ctx, tx))
	}
	return n
}

func rowsWritten(ctx context.Context, t *testing.T, tx pgx.Tx) int {
	t.Helper()
	return countIn(ctx, t, tx, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.dedupe) + (SELECT count(*) FROM outbox.sequences)`)
}

func txState(ctx context.Context, tx pgx.Tx) string {
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		return "aborted (" + err.Error() + ")"
	}
	return "still usable"
}

// checkStored compares the stored row with the message.
func checkStored(ctx context.Context, t *testing.T, tx pgx.Tx, r outbox.Enqueued, m outbox.Message) {
	t.Helper()
	var (
		ns, topic                           string
		tenant, dedupe, ordering, trace     *string
		headers                             map[string]string
		payloadMatches                      bool
		payloadBytes                        int
		availableAt, createdAt, nextAttempt time.Time
	)
	err := tx.QueryRow(ctx, `SELECT namespace, topic, tenant_id, dedupe_key, ordering_key, trace_header, headers,
			payload = $2::jsonb, payload_bytes, available_at, created_at, next_attempt_at
		FROM outbox.pending WHERE id = $1`, r.ID, string(m.Payload)).
		Scan(&ns, &topic, &tenant, &dedupe, &ordering, &trace, &headers, &payloadMatches, &payloadBytes, &availableAt, &createdAt, &nextAttempt)
	if err != nil {
		t.Fatalf("read back %s: %v", r.ID, err)
	}
	deref := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	wantHeaders := m.Headers
	if wantHeaders == nil {
		wantHeaders = map[string]string{}
	}
	if ns != m.Namespace || topic != m.Topic || deref(tenant) != m.TenantID || deref(dedupe) != m.DedupeKey ||
		deref(ordering) != m.OrderingKey || deref(trace) != m.TraceHeader || !maps.Equal(headers, wantHeaders) || !payloadMatches {
		t.Fatalf("stored %q %q %q %q %q %q %v (payload equal: %v), enqueued %+v", ns, topic, deref(tenant), deref(dedupe),
			deref(ordering), deref(trace), headers, payloadMatches, m)
	}
	// The size recorded is the size as stored, as the producer measured it.
	if want, err := outbox.StoredSize(m.Payload); err != nil || payloadBytes != want {
		t.Fatalf("payload_bytes %d, the producer's StoredSize %d (%v), for %s", payloadBytes, want, err, m.Payload)
	}
	// A message is never due before it is created, nor before it asked.
	if availableAt.Before(createdAt) || !nextAttempt.Equal(availableAt) ||
		(!m.AvailableAt.IsZero() && m.AvailableAt.After(createdAt) && !availableAt.Equal(m.AvailableAt.Truncate(time.Microsecond))) {
		t.Fatalf("available_at %s, next_attempt_at %s, created_at %s for AvailableAt %s", availableAt, nextAttempt, createdAt, m.AvailableAt)
	}
}
