package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// sqlResult is one result of a completion as a caller of
// outbox.complete_batch writes it, in either of its forms.
type sqlResult struct {
	id, token                                           uuid.UUID
	outcome, errorCode, errorMessage, target, targetRef string
	latencyMS                                           int32
	retryAt                                             time.Time
	onDead                                              string
	hold                                                bool
}

// document is the results as the contract's JSON document, with the keys
// a result does not have left out.
func document(results []sqlResult) string {
	docs := make([]map[string]any, len(results))
	for i, r := range results {
		d := map[string]any{"id": r.id, "lease_token": r.token, "outcome": r.outcome, "latency_ms": r.latencyMS}
		for key, v := range map[string]string{"error_code": r.errorCode, "error_message": r.errorMessage,
			"target": r.target, "target_ref": r.targetRef, "on_dead": r.onDead} {
			if v != "" {
				d[key] = v
			}
		}
		if !r.retryAt.IsZero() {
			d["retry_at"] = r.retryAt
		}
		if r.hold {
			d["hold"] = true
		}
		docs[i] = d
	}
	b, err := json.Marshal(docs)
	if err != nil {
		panic(err)
	}
	return string(b)
}

const completeArraysSQL = `SELECT id, status FROM outbox.complete_batch('w', NULL, $1, $2,
	p_ids => $3, p_lease_tokens => $4, p_outcomes => $5, p_error_codes => $6, p_error_messages => $7,
	p_targets => $8, p_target_refs => $9, p_latencies_ms => $10, p_retry_at => $11, p_on_dead => $12, p_hold => $13)`

// arrays is the results as complete_batch's array arguments, in the order
// of completeArraysSQL from $3 on; a result without a field has a NULL.
func arrays(results []sqlResult) []any {
	n := len(results)
	ids, tokens := make([]pgtype.UUID, n), make([]pgtype.UUID, n)
	outcomes, codes, messages := make([]pgtype.Text, n), make([]pgtype.Text, n), make([]pgtype.Text, n)
	targets, refs, onDead := make([]pgtype.Text, n), make([]pgtype.Text, n), make([]pgtype.Text, n)
	latencies, retryAt, hold := make([]int32, n), make([]pgtype.Timestamptz, n), make([]pgtype.Bool, n)
	text := func(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }
	for i, r := range results {
		ids[i], tokens[i] = pgtype.UUID{Bytes: r.id, Valid: true}, pgtype.UUID{Bytes: r.token, Valid: true}
		outcomes[i], codes[i], messages[i] = text(r.outcome), text(r.errorCode), text(r.errorMessage)
		targets[i], refs[i], onDead[i] = text(r.target), text(r.targetRef), text(r.onDead)
		latencies[i] = r.latencyMS
		retryAt[i] = pgtype.Timestamptz{Time: r.retryAt, Valid: !r.retryAt.IsZero()}
		hold[i] = pgtype.Bool{Bool: true, Valid: r.hold}
	}
	return []any{ids, tokens, outcomes, codes, messages, targets, refs, latencies, retryAt, onDead, hold}
}

// completions reads complete_batch's answer; the entry of uuid.Nil lists
// the ids in the order they came.
func completions(t *testing.T) func(pgx.Rows, error) map[uuid.UUID]string {
	return func(rows pgx.Rows, err error) map[uuid.UUID]string {
		t.Helper()
		return readCompletions(t, rows, err)
	}
}

func readCompletions(t *testing.T, rows pgx.Rows, err error) map[uuid.UUID]string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]string{}
	var order []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		var status string
		if err := rows.Scan(&id, &status); err != nil {
			t.Fatal(err)
		}
		got[id] = status
		order = append(order, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	got[uuid.Nil] = fmt.Sprint(order)
	return got
}

// One batch of every kind of result, completed once as the JSON document
// and once, on a twin of each message, as arrays: the statuses, the rows
// left in pending and dead and the archived attempts are the same. With
// p_omit_ok, the statuses recorded as ok are left out and the others come
// in the results' order.
func TestCompleteBatchDocumentAndArraysAgree(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	retryAt := time.Now().Add(time.Hour).Truncate(time.Millisecond).UTC()
	situations := []struct {
		name    string
		ordered bool
		attempt int  // the message's attempt count when it is completed
		poison  bool // an earlier DISPATCHED outcome of the message is on record
		stale   bool // completed under a token that is not its lease's
		result  sqlResult
		want    string
		leaves  string // where the message is afterwards: pending, dead or gone
	}{
		{name: "delivered", result: sqlResult{outcome: "DISPATCHED", target: "hook", targetRef: "evt-1", latencyMS: 12}, want: "ok", leaves: "gone"},
		{name: "retried", result: sqlResult{outcome: "RETRYABLE", errorCode: "TARGET_5XX", errorMessage: "503", target: "hook", latencyMS: 3, retryAt: retryAt},
			want: "ok", leaves: "pending"},
		{name: "retried at the ceiling", attempt: 5, result: sqlResult{outcome: "RETRYABLE", errorCode: "TARGET_5XX", retryAt: retryAt}, want: "dead", leaves: "dead"},
		{name: "held at the ceiling", attempt: 5, result: sqlResult{outcome: "RETRYABLE", errorCode: "ACCESS_DENIED", retryAt: retryAt, hold: true}, want: "ok", leaves: "pending"},
		{name: "failed", result: sqlResult{outcome: "FAILED", errorCode: "TARGET_REJECTED", errorMessage: "400", target: "hook"}, want: "ok", leaves: "dead"},
		{name: "released", result: sqlResult{outcome: "RELEASED"}, want: "ok", leaves: "pending"},
		{name: "lease lost", stale: true, result: sqlResult{outcome: "DISPATCHED"}, want: "lease_lost", leaves: "pending"},
		{name: "dispatched twice", poison: true, result: sqlResult{outcome: "DISPATCHED", target: "hook"}, want: "double_dispatch", leaves: "gone"},
		{name: "ordered, retried, parks if it dies", ordered: true, result: sqlResult{outcome: "RETRYABLE", onDead: "park"}, want: "ok", leaves: "pending"},
		{name: "ordered, failed, parks", ordered: true, result: sqlResult{outcome: "FAILED", errorCode: "TARGET_REJECTED", onDead: "park"}, want: "ok", leaves: "dead"},
	}
	// Message i of each form is situation i's.
	var msgs []outbox.Message
	for _, form := range []string{"document", "arrays"} {
		for i, s := range situations {
			m := outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(fmt.Sprintf(`{"form": %q, "situation": %d}`, form, i))}
			if s.ordered {
				m.OrderingKey = fmt.Sprintf("%s-%d", form, i)
			}
			msgs = append(msgs, m)
		}
	}
	enqueued, err := outbox.EnqueueBatch(ctx, db.Pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 100, Lease: time.Minute})
	if err != nil || len(claimed) != len(msgs) {
		t.Fatalf("claimed %d of %d: %v", len(claimed), len(msgs), err)
	}
	tokens := map[uuid.UUID]uuid.UUID{}
	for _, m := range claimed {
		tokens[m.ID] = m.LeaseToken
	}
	batches := map[string][]sqlResult{}
	for f, form := range []string{"document", "arrays"} {
		for i, s := range situations {
			r := s.result
			r.id = enqueued[f*len(situations)+i].ID
			r.token = tokens[r.id]
			if s.stale {
				r.token = uuid.New()
			}
			if s.attempt > 0 {
				if _, err := db.Pool.Exec(ctx, `UPDATE outbox.pending SET attempt_count = $2 WHERE id = $1`, r.id, s.attempt); err != nil {
					t.Fatal(err)
				}
			}
			if s.poison {
				if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic)
					VALUES ($1, 1, 'DISPATCHED', 'billing', 'usage')`, r.id); err != nil {
					t.Fatal(err)
				}
			}
			batches[form] = append(batches[form], r)
		}
	}

	byDocument := completions(t)(db.Pool.Query(ctx, `SELECT id, status FROM outbox.complete_batch('w', $1::jsonb, 5)`, document(batches["document"])))
	byArrays := completions(t)(db.Pool.Query(ctx, completeArraysSQL, append([]any{5, true}, arrays(batches["arrays"])...)...))

	var wantDocumentOrder, wantArraysOrder []uuid.UUID
	for i, s := range situations {
		docID, arrID := batches["document"][i].id, batches["arrays"][i].id
		wantDocumentOrder = append(wantDocumentOrder, docID)
		if got := byDocument[docID]; got != s.want {
			t.Errorf("%s, as a document: status %q, want %q", s.name, got, s.want)
		}
		if s.want != "ok" {
			wantArraysOrder = append(wantArraysOrder, arrID)
		}
		if got, answered := byArrays[arrID]; s.want == "ok" && answered || s.want != "ok" && got != s.want {
			t.Errorf("%s, as arrays with p_omit_ok: status %q (answered %v), want %q, and only if it is not ok", s.name, got, answered, s.want)
		}
		doc, arr := snapshot(t, db, docID, retryAt), snapshot(t, db, arrID, retryAt)
		if doc != arr {
			t.Errorf("%s: the two forms left different rows:\n  document: %s\n  arrays:   %s", s.name, doc, arr)
		}
		if leaves := whereIs(t, db, docID); leaves != s.leaves {
			t.Errorf("%s: the message is %s, want %s: %s", s.name, leaves, s.leaves, doc)
		}
	}
	if got, want := byDocument[uuid.Nil], fmt.Sprint(wantDocumentOrder); got != want {
		t.Errorf("the document's statuses came in the order %s, want the results' %s", got, want)
	}
	if got, want := byArrays[uuid.Nil], fmt.Sprint(wantArraysOrder); got != want {
		t.Errorf("the arrays' statuses came in the order %s, want the results' %s", got, want)
	}
}

// snapshot is what a completion left of one message, without what differs
// between twins (ids, payloads, times other than the retry time).
func snapshot(t *testing.T, db *pgtest.DB, id uuid.UUID, retryAt time.Time) string {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(context.Background(), `SELECT jsonb_build_object(
		'pending', (SELECT jsonb_build_object('attempt_count', p.attempt_count, 'leased', p.lease_token IS NOT NULL,
		            'claimed_by', p.claimed_by, 'due_at_retry', p.next_attempt_at = $2, 'last_error_code', p.last_error_code,
		            'last_error', p.last_error, 'failing', p.failing_since IS NOT NULL, 'park_on_dead', p.park_on_dead,
		            'ordered', p.ordering_key IS NOT NULL, 'behind', p.behind)
		            FROM outbox.pending p WHERE p.id = $1),
		'dead', (SELECT jsonb_build_object('attempt_count', d.attempt_count, 'last_error_code', d.last_error_code,
		         'last_error', d.last_error, 'failed_by', d.failed_by, 'holds_key', d.holds_key, 'payload', d.payload IS NOT NULL,
		         'headers', d.headers, 'payload_bytes', d.payload_bytes IS NOT NULL)
		         FROM outbox.dead d WHERE d.id = $1),
		'attempts', (SELECT jsonb_agg(jsonb_build_object('attempt_no', a.attempt_no, 'state', a.state, 'worker_id', a.worker_id,
		             'target', a.target, 'target_ref', a.target_ref, 'error_code', a.error_code,
		             'error_message', a.error_message, 'latency_ms', a.latency_ms) ORDER BY a.id)
		             FROM outbox.attempts a WHERE a.message_id = $1))::text`, id, retryAt).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func whereIs(t *testing.T, db *pgtest.DB, id uuid.UUID) string {
	t.Helper()
	var where string
	err := db.Pool.QueryRow(context.Background(), `SELECT CASE
		WHEN EXISTS (SELECT 1 FROM outbox.pending WHERE id = $1) THEN 'pending'
		WHEN EXISTS (SELECT 1 FROM outbox.dead WHERE id = $1) THEN 'dead' ELSE 'gone' END`, id).Scan(&where)
	if err != nil {
		t.Fatal(err)
	}
	return where
}

// complete_batch checks a batch from the statement that records it, after
// it has run; a malformed batch must still leave nothing behind, in either
// form, though a well-formed result in it was recorded before the check.
func TestCompleteBatchRefusesAMalformedBatchWhole(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := outbox.EnqueueBatch(ctx, db.Pool, []outbox.Message{
		{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(`{"n": 1}`)},
		{Namespace: "billing", Topic: "usage", OrderingKey: "acct-1", Payload: json.RawMessage(`{"n": 2}`)},
	}); err != nil {
		t.Fatal(err)
	}
	claimed, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 2, Lease: time.Minute})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claimed %d: %v", len(claimed), err)
	}
	good := sqlResult{id: claimed[0].ID, token: claimed[0].LeaseToken, outcome: "DISPATCHED", target: "hook"}
	other := sqlResult{id: claimed[1].ID, token: claimed[1].LeaseToken, outcome: "FAILED", errorCode: "TARGET_REJECTED"}
	with := func(change func(*sqlResult)) []sqlResult {
		r := other
		change(&r)
		return []sqlResult{good, r}
	}
	documents := map[string]string{
		"an unknown outcome":   document(with(func(r *sqlResult) { r.outcome = "DELIVERED" })),
		"no outcome":           document(with(func(r *sqlResult) { r.outcome = "" })),
		"an unknown on_dead":   document(with(func(r *sqlResult) { r.onDead = "later" })),
		"an id given twice":    document([]sqlResult{good, good}),
		"no lease_token":       strings.Replace(document([]sqlResult{good, other}), `"lease_token":"`+other.token.String()+`",`, "", 1),
		"an id that is no id":  strings.Replace(document([]sqlResult{good, other}), other.id.String(), "nope", 1),
		"a latency not an int": strings.Replace(document([]sqlResult{good, other}), `"latency_ms":0`, `"latency_ms":"slow"`, 1),
		"not an array":         `{"id": "` + good.id.String() + `"}`,
		"an array of numbers":  `[1, 2]`,
	}
	for what, doc := range documents {
		_, err := db.Pool.Exec(ctx, `SELECT * FROM outbox.complete_batch('w', $1::jsonb)`, doc)
		if sqlstate(err) != "P7003" {
			t.Errorf("a document with %s: %v, want P7003", what, err)
		}
	}
	calls := map[string][]any{
		"an unknown outcome": arrays(with(func(r *sqlResult) { r.outcome = "DELIVERED" })),
		"no outcome":         arrays(with(func(r *sqlResult) { r.outcome = "" })),
		"an unknown on_dead": arrays(with(func(r *sqlResult) { r.onDead = "later" })),
		"an id given twice":  arrays([]sqlResult{good, good}),
		"no lease_token":     append(arrays([]sqlResult{good, other})[:1], append([]any{[]pgtype.UUID{{Bytes: good.token, Valid: true}, {}}}, arrays([]sqlResult{good, other})[2:]...)...),
		"a token too few":    append(arrays([]sqlResult{good, other})[:1], append([]any{[]pgtype.UUID{{Bytes: good.token, Valid: true}}}, arrays([]sqlResult{good, other})[2:]...)...),
		"a target too many":  append(arrays([]sqlResult{good, other})[:5], append([]any{[]string{"a", "b", "c"}}, arrays([]sqlResult{good, other})[6:]...)...),
		"no outcomes":        append(arrays([]sqlResult{good, other})[:2], append([]any{nil}, arrays([]sqlResult{good, other})[3:]...)...),
	}
	for what, args := range calls {
		_, err := db.Pool.Exec(ctx, completeArraysSQL, append([]any{100, true}, args...)...)
		if sqlstate(err) != "P7003" {
			t.Errorf("arrays with %s: %v, want P7003", what, err)
		}
	}
	for what, sql := range map[string]string{
		"both forms": `SELECT * FROM outbox.complete_batch('w', '[]', p_ids => ARRAY[gen_random_uuid()])`,
		"neither":    `SELECT * FROM outbox.complete_batch('w', NULL)`,
	} {
		if _, err := db.Pool.Exec(ctx, sql); sqlstate(err) != "P7003" {
			t.Errorf("%s: %v, want P7003", what, err)
		}
	}

	var leased, attempts, dead int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox.pending WHERE claimed_by = 'w' AND lease_token = ANY ($1)),
		(SELECT count(*) FROM outbox.attempts), (SELECT count(*) FROM outbox.dead)`,
		[]uuid.UUID{good.token, other.token}).Scan(&leased, &attempts, &dead); err != nil {
		t.Fatal(err)
	}
	if leased != 2 || attempts != 0 || dead != 0 {
		t.Fatalf("after the refused completions: %d of 2 messages still leased as claimed, %d attempts, %d dead letters; want 2, 0, 0", leased, attempts, dead)
	}
	// The same two results, well formed, are recorded.
	got := completions(t)(db.Pool.Query(ctx, `SELECT id, status FROM outbox.complete_batch('w', $1::jsonb)`, document([]sqlResult{good, other})))
	if got[good.id] != "ok" || got[other.id] != "ok" {
		t.Fatalf("the well-formed batch: %v", got)
	}
}

// A batch of DISPATCHED results only takes a statement of its own (the
// common case, kept lean), and one claim's, under its one token, a leaner
// one still; the same results in a batch with another outcome take the
// general one. All three record them alike: statuses, attempts, what is
// left in pending.
func TestCompleteBatchAllDispatchedAsAnyOtherBatch(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	msgs := make([]outbox.Message, 12)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, i))}
		if i%4 == 3 {
			msgs[i].OrderingKey = fmt.Sprintf("acct-%d", i)
		}
	}
	// Each ordered message has a successor, which becomes its key's head
	// once it is delivered.
	successors := []outbox.Message{
		{Namespace: "billing", Topic: "usage", OrderingKey: "acct-3", Payload: json.RawMessage(`{}`)},
		{Namespace: "billing", Topic: "usage", OrderingKey: "acct-7", Payload: json.RawMessage(`{}`)},
		{Namespace: "billing", Topic: "usage", OrderingKey: "acct-11", Payload: json.RawMessage(`{}`)},
	}
	enqueued, err := outbox.EnqueueBatch(ctx, db.Pool, append(msgs, successors...))
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 100, Lease: time.Minute})
	if err != nil || len(claimed) != len(msgs) {
		t.Fatalf("claimed %d of %d: %v", len(claimed), len(msgs), err)
	}
	tokens := map[uuid.UUID]uuid.UUID{}
	for _, m := range claimed {
		tokens[m.ID] = m.LeaseToken
	}
	// Messages 0-3 alone under their claim's one token, 4-7 alone, 8-11
	// with a RELEASED result added: each group has a delivery with every
	// field, one whose lease was lost (0-3: its row leased anew; 4-11: the
	// result under a stale token, so that the batch has more than one), one
	// delivered before, and an ordered one.
	wants := []string{"ok", "lease_lost", "double_dispatch", "ok"}
	group := func(first int) []sqlResult {
		var rs []sqlResult
		for i := first; i < first+4; i++ {
			id := enqueued[i].ID
			r := sqlResult{id: id, token: tokens[id], outcome: "DISPATCHED", target: "hook", targetRef: fmt.Sprint("ref-", i%4),
				errorCode: "SLOW", errorMessage: strings.Repeat("é", 5000), latencyMS: int32(i % 4)}
			switch i % 4 {
			case 1:
				if first == 0 {
					if _, err := db.Pool.Exec(ctx, `UPDATE outbox.pending SET lease_token = gen_random_uuid() WHERE id = $1`, id); err != nil {
						t.Fatal(err)
					}
					break
				}
				r.token = uuid.New()
			case 2:
				if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic)
					VALUES ($1, 1, 'DISPATCHED', 'billing', 'usage')`, id); err != nil {
					t.Fatal(err)
				}
			}
			rs = append(rs, r)
		}
		return rs
	}
	oneClaim, alone, mixed := group(0), group(4), group(8)
	extra, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	more, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 1, Lease: time.Minute})
	if err != nil || len(more) != 1 || more[0].ID != extra.ID {
		t.Fatalf("claim of the released message: %v %v", more, err)
	}
	mixed = append(mixed, sqlResult{id: more[0].ID, token: more[0].LeaseToken, outcome: "RELEASED"})

	for name, batch := range map[string][]sqlResult{"one claim's, all DISPATCHED": oneClaim, "all DISPATCHED": alone, "with a RELEASED result": mixed} {
		got := completions(t)(db.Pool.Query(ctx, completeArraysSQL, append([]any{100, false}, arrays(batch)...)...))
		var order []uuid.UUID
		for i, r := range batch {
			order = append(order, r.id)
			if want := append(wants, "ok")[i]; got[r.id] != want {
				t.Errorf("%s: result %d is %q, want %q", name, i, got[r.id], want)
			}
		}
		if got[uuid.Nil] != fmt.Sprint(order) {
			t.Errorf("%s: statuses in the order %s, want %s", name, got[uuid.Nil], fmt.Sprint(order))
		}
	}
	for i := range wants {
		o, a, m := snapshot(t, db, oneClaim[i].id, time.Time{}), snapshot(t, db, alone[i].id, time.Time{}), snapshot(t, db, mixed[i].id, time.Time{})
		if o != m || a != m {
			t.Errorf("result %d left different rows:\n  one claim's:    %s\n  all DISPATCHED: %s\n  mixed:          %s", i, o, a, m)
		}
	}
	var heads int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox.pending WHERE id = ANY ($1) AND NOT behind`,
		[]uuid.UUID{enqueued[len(msgs)].ID, enqueued[len(msgs)+1].ID, enqueued[len(msgs)+2].ID}).Scan(&heads); err != nil {
		t.Fatal(err)
	}
	if heads != 3 {
		t.Errorf("%d of the 3 delivered keys have their next message as head, want all", heads)
	}
}

// The outcomes of a batch are archived in the order of its results, which
// is the order their messages were delivered in (a run's in sequence
// order), whatever order the statement found the rows in: the archive is
// what an audit reads the delivery order from.
func TestCompleteBatchArchivesInTheResultsOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	msgs := make([]outbox.Message, 20)
	for i := range msgs {
		msgs[i] = outbox.Message{Namespace: "billing", Topic: "usage", Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, i))}
	}
	if _, err := outbox.EnqueueBatch(ctx, db.Pool, msgs); err != nil {
		t.Fatal(err)
	}
	claimed, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 20, Lease: time.Minute})
	if err != nil || len(claimed) != len(msgs) {
		t.Fatalf("claimed %d of %d: %v", len(claimed), len(msgs), err)
	}
	// The results in the reverse of the queue's order; the first half all
	// DISPATCHED, the second half with a retry among them.
	for h, half := range [][]outboxtype.Message{claimed[:10], claimed[10:]} {
		var results []sqlResult
		for i := len(half) - 1; i >= 0; i-- {
			results = append(results, sqlResult{id: half[i].ID, token: half[i].LeaseToken, outcome: "DISPATCHED"})
		}
		if h == 1 {
			results[4].outcome = "RETRYABLE"
		}
		completions(t)(db.Pool.Query(ctx, completeArraysSQL, append([]any{100, true}, arrays(results)...)...))
		var want, got []uuid.UUID
		for _, r := range results {
			want = append(want, r.id)
		}
		rows, err := db.Pool.Query(ctx, `SELECT message_id FROM outbox.attempts WHERE message_id = ANY ($1) ORDER BY id`, want)
		if err != nil {
			t.Fatal(err)
		}
		if got, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("archived in the order\n  %v\nwant the results'\n  %v", got, want)
		}
	}
}

// complete_batch finds a batch's rows by primary key, whatever the
// statistics of outbox.pending say. They are often wrong for it: taken
// while nothing was leased, they say no row is leased to any worker (and
// worker ids are new with every invocation), and a plan may be cached for
// the session while the queue was nearly empty. Either way, completing
// 1,000 of 10,000 pending messages must read those 1,000 rows of pending,
// neither the queue nor the batch once per result.
func TestCompleteBatchReadsOnlyItsRowsWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// cached completes a batch of one on the session first, while the
		// queue holds one message (its statistics those of an empty one).
		cached bool
	}{{"statistics from before any lease", false}, {"plan cached on an empty queue", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx := context.Background()
			if _, err := db.Pool.Exec(ctx, `ALTER TABLE outbox.pending SET (autovacuum_enabled = off)`); err != nil {
				t.Fatal(err)
			}
			conn := pgtest.Connect(t, db.URL)
			enqueue := func(n int) {
				msgs := make([]outbox.Message, n)
				for i := range msgs {
					msgs[i] = outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: uuid.NewString(),
						Payload: json.RawMessage(`{"pad": "` + strings.Repeat("x", 400) + `"}`)}
				}
				for start := 0; start < n; start += 1000 {
					if _, err := outbox.EnqueueBatch(ctx, db.Pool, msgs[start:min(n, start+1000)]); err != nil {
						t.Fatal(err)
					}
				}
			}
			// complete claims n messages as a new worker (on another
			// connection) and completes them as dispatched on conn; it
			// returns how the completion read pending, from the session's
			// counters (which hold what is not yet reported, so the
			// difference is taken).
			complete := func(worker string, n int) (seqScans, fetched int64) {
				claimed, err := lease.NewStore(db.Pool).ClaimBatch(ctx, lease.ClaimParams{WorkerID: worker, BatchSize: n, Lease: time.Minute})
				if err != nil || len(claimed) != n {
					t.Fatalf("claimed %d of %d: %v", len(claimed), n, err)
				}
				results := make([]lease.Result, len(claimed))
				for i, m := range claimed {
					results[i] = lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeDispatched}
				}
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				read := func() (scans, rows int64) {
					if err := tx.QueryRow(ctx, `SELECT coalesce(seq_scan, 0), coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
						WHERE relid = 'outbox.pending'::regclass`).Scan(&scans, &rows); err != nil {
						t.Fatal(err)
					}
					return scans, rows
				}
				scans0, rows0 := read()
				if _, err := lease.NewStore(tx).CompleteBatch(ctx, worker, results); err != nil {
					t.Fatal(err)
				}
				scans1, rows1 := read()
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				return scans1 - scans0, rows1 - rows0
			}
			if tc.cached {
				if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE outbox.pending`); err != nil {
					t.Fatal(err)
				}
				enqueue(1)
				complete("first", 1)
				enqueue(10_000)
			} else {
				enqueue(10_000)
				if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE outbox.pending`); err != nil {
					t.Fatal(err)
				}
			}
			if seqScans, fetched := complete("w-"+uuid.NewString(), 1000); seqScans != 0 || fetched > 1000 {
				t.Fatalf("completing 1,000 of 10,000 pending messages scanned outbox.pending %d time(s) and fetched %d of its rows by index, want 0 and 1,000",
					seqScans, fetched)
			}
		})
	}
}
