// Package outbox is the producer side of the transactional outbox: it writes
// messages with outbox.enqueue() in the caller's own transaction, so that a
// business change and the message announcing it commit or roll back together.
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	// ... the business change, e.g. a compare-and-set UPDATE ...
//	res, err := outbox.Enqueue(ctx, tx, outbox.Message{
//		Namespace: "billing",
//		Topic:     "usage_snapshot",
//		TenantID:  tenantID,
//		DedupeKey: tenantID + "/" + turnID + "/" + requestID,
//		Payload:   payload, // a JSON object or array
//	})
//	// ...
//	tx.Commit(ctx)
//
// Every message is validated before the database is touched, so a rejected
// message leaves the caller's transaction usable; the error is a
// *ValidationError naming the field.
//
// Idempotency: a message with a DedupeKey is stored at most once per
// (namespace, topic, dedupe key) for as long as the dedupe window lasts after
// delivery; enqueueing it again returns the first message's id with
// Inserted = false and writes nothing.
//
// Ordering: messages with the same OrderingKey get increasing sequence ids and
// are delivered one at a time in that order. Ordering keys are global across
// namespaces: prefix them (for example "billing:tenant-42") when two streams
// must not wait for each other.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Querier runs a query: a pgx.Tx (the caller's transaction, above all), a
// *pgx.Conn or a *pgxpool.Pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Message is one outbox message.
type Message struct {
	// Namespace and Topic route the message (required). They start with a
	// letter or digit and contain letters, digits and . _ : / - only.
	Namespace string
	Topic     string
	// Payload is the message body: a JSON object or array (required).
	Payload json.RawMessage
	// TenantID is carried to the target for its own partitioning (optional).
	TenantID string
	// DedupeKey makes the enqueue idempotent and is the stable key receivers
	// deduplicate on (optional, but recommended: without it the message id is
	// the only key).
	DedupeKey string
	// OrderingKey delivers the key's messages one at a time in enqueue order
	// (optional).
	OrderingKey string
	// Headers are delivered as message attributes or HTTP headers (optional).
	Headers map[string]string
	// TraceHeader is an X-Ray trace header (Root=1-...;Parent=...;Sampled=1)
	// carried to the target (optional; by default the producer's own, see
	// Producer.TraceHeader).
	TraceHeader string
	// AvailableAt delays delivery until then (optional; zero means now).
	AvailableAt time.Time
}

// Enqueued is the outcome of one enqueue.
type Enqueued struct {
	// ID is the message id: the new one, or on a dedupe hit the id of the
	// message first enqueued under the key.
	ID uuid.UUID
	// SequenceID orders messages of one ordering key; 0 without one.
	SequenceID int64
	// Inserted is false when the dedupe key was already present.
	Inserted bool
}

// Producer enqueues messages under a set of limits. The zero value uses
// DefaultLimits.
type Producer struct {
	Limits Limits
	// TraceHeader, when set, supplies the trace header of messages that
	// carry none, e.g. tracing.Tracer.TraceHeader for a service traced with
	// the X-Ray SDK. Without it the header of a Lambda invocation's context
	// is used, when there is one.
	TraceHeader func(ctx context.Context) string
}

// lambdaTraceHeaderKey is where aws-lambda-go puts the invocation's
// X-Amzn-Trace-Id in the context: an untyped string key, by its contract.
// Reading it needs no import of the Lambda or X-Ray libraries.
const lambdaTraceHeaderKey = "x-amzn-trace-id"

func (p Producer) traceHeader(ctx context.Context, m Message) string {
	if m.TraceHeader != "" {
		return m.TraceHeader
	}
	if p.TraceHeader != nil {
		return p.TraceHeader(ctx)
	}
	h, _ := ctx.Value(lambdaTraceHeaderKey).(string)
	return h
}

var defaultProducer Producer

// Enqueue writes one message with DefaultLimits. See Producer.Enqueue.
func Enqueue(ctx context.Context, db Querier, msg Message) (Enqueued, error) {
	return defaultProducer.Enqueue(ctx, db, msg)
}

// EnqueueBatch writes messages with DefaultLimits. See Producer.EnqueueBatch.
func EnqueueBatch(ctx context.Context, db Querier, msgs []Message) ([]Enqueued, error) {
	return defaultProducer.EnqueueBatch(ctx, db, msgs)
}

const enqueueSQL = `SELECT message_id, sequence_id, inserted
FROM outbox.enqueue($1, $2, $3::jsonb, $4, $5, $6, $7::jsonb, $8, coalesce($9::timestamptz, now()))`

// Enqueue validates msg and writes it with one call to outbox.enqueue().
// Run it in the transaction that makes the business change.
func (p Producer) Enqueue(ctx context.Context, db Querier, msg Message) (Enqueued, error) {
	msg.TraceHeader = p.traceHeader(ctx, msg)
	if err := p.limits().validate(msg, -1); err != nil {
		return Enqueued{}, err
	}
	headers, err := encodeHeaders(msg.Headers)
	if err != nil {
		return Enqueued{}, err
	}
	rows, err := db.Query(ctx, enqueueSQL,
		msg.Namespace, msg.Topic, string(msg.Payload), nullable(msg.TenantID), nullable(msg.DedupeKey),
		nullable(msg.OrderingKey), headers, nullable(msg.TraceHeader), nullableTime(msg.AvailableAt))
	if err != nil {
		return Enqueued{}, enqueueError("enqueue", err)
	}
	results, err := collect(rows, 1)
	if err != nil {
		return Enqueued{}, err
	}
	return results[0], nil
}

// The batch is sent as parallel arrays to outbox.enqueue_batch(), the
// set-based form of outbox.enqueue(): a batch of any size is one statement
// and one round trip, with the same dedupe and sequencing results as
// enqueueing the messages one by one in order.
const enqueueBatchSQL = `SELECT message_id, sequence_id, inserted
FROM outbox.enqueue_batch($1, $2, $3, $4, $5, $6, $7, $8, $9)`

// EnqueueBatch validates every message, then writes them all in one round
// trip. Results are in input order; a dedupe key repeated within the batch
// is a dedupe hit on its first occurrence. If any message is invalid nothing
// is written and the error names the message's index and field.
func (p Producer) EnqueueBatch(ctx context.Context, db Querier, msgs []Message) ([]Enqueued, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	limits := p.limits()
	if len(msgs) > limits.MaxBatch {
		return nil, &ValidationError{Index: -1, Field: "batch", Reason: fmt.Sprintf("has %d messages, more than the limit of %d", len(msgs), limits.MaxBatch)}
	}
	n := len(msgs)
	var (
		namespaces   = make([]string, n)
		topics       = make([]string, n)
		payloads     = make([]string, n)
		tenantIDs    = optionalColumn[string]{values: make([]*string, n)}
		dedupeKeys   = optionalColumn[string]{values: make([]*string, n)}
		orderingKeys = optionalColumn[string]{values: make([]*string, n)}
		headers      = optionalColumn[string]{values: make([]*string, n)}
		traceHeaders = optionalColumn[string]{values: make([]*string, n)}
		availableAt  = optionalColumn[time.Time]{values: make([]*time.Time, n)}
	)
	for i, msg := range msgs {
		msg.TraceHeader = p.traceHeader(ctx, msg)
		if err := limits.validate(msg, i); err != nil {
			return nil, err
		}
		namespaces[i], topics[i], payloads[i] = msg.Namespace, msg.Topic, string(msg.Payload)
		tenantIDs.set(i, nullable(msg.TenantID))
		dedupeKeys.set(i, nullable(msg.DedupeKey))
		orderingKeys.set(i, nullable(msg.OrderingKey))
		traceHeaders.set(i, nullable(msg.TraceHeader))
		availableAt.set(i, nullableTime(msg.AvailableAt))
		if len(msg.Headers) > 0 {
			h, err := encodeHeaders(msg.Headers)
			if err != nil {
				return nil, err
			}
			headers.set(i, &h)
		}
	}
	rows, err := db.Query(ctx, enqueueBatchSQL, namespaces, topics, payloads, tenantIDs.arg(), dedupeKeys.arg(),
		orderingKeys.arg(), headers.arg(), traceHeaders.arg(), availableAt.arg())
	if err != nil {
		return nil, enqueueError("enqueue batch", err)
	}
	return collect(rows, n)
}

// optionalColumn is one optional field across a batch; it is sent as NULL
// when no message sets it, so the database skips that step entirely.
type optionalColumn[T any] struct {
	values []*T
	any    bool
}

func (c *optionalColumn[T]) set(i int, v *T) {
	c.values[i] = v
	c.any = c.any || v != nil
}

func (c *optionalColumn[T]) arg() []*T {
	if !c.any {
		return nil
	}
	return c.values
}

func collect(rows pgx.Rows, want int) ([]Enqueued, error) {
	out := make([]Enqueued, 0, want)
	// Each row is scanned in place, the id as the 16 bytes it is and the
	// sequence into a pgtype.Int8 declared once: as a uuid.UUID (a
	// sql.Scanner) pgx formatted every id as text for uuid.Parse to read
	// back, and into a *int64 it allocated each sequence, five heap
	// objects a message of a batch's result.
	var seq pgtype.Int8
	for rows.Next() {
		out = append(out, Enqueued{})
		e := &out[len(out)-1]
		if err := rows.Scan((*[16]byte)(&e.ID), &seq, &e.Inserted); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: read enqueue result: %w", err)
		}
		e.SequenceID = seq.Int64 // 0 when NULL: no ordering key
	}
	if err := rows.Err(); err != nil {
		return nil, enqueueError("enqueue", err)
	}
	if len(out) != want {
		return nil, fmt.Errorf("outbox: enqueue returned %d results for %d messages", len(out), want)
	}
	return out, nil
}

// sqlstateInvalidMessage is the database refusing a message (outbox.limits
// or a rule this package also checks).
const sqlstateInvalidMessage = "P7004"

// enqueueError turns the database's refusal of a message into the
// *ValidationError this package would have returned, marked InDatabase.
func enqueueError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateInvalidMessage {
		index := -1
		fmt.Sscanf(pgErr.Detail, "message index: %d", &index)
		return &ValidationError{Index: index, Field: pgErr.ColumnName, Reason: pgErr.Message, InDatabase: true}
	}
	return fmt.Errorf("outbox: %s: %w", op, err)
}

func (p Producer) limits() Limits {
	if p.Limits == (Limits{}) {
		return DefaultLimits
	}
	return p.Limits.withDefaults()
}

func encodeHeaders(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("outbox: encode headers: %w", err)
	}
	return string(b), nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullableTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

const producerLimitsSQL = `SELECT max_payload_bytes, max_key_bytes, max_headers, max_header_value_bytes,
	extract(epoch FROM max_delay)::float8 FROM outbox.producer_limits()`

// LoadLimits reads the limits the database holds every producer to (table
// outbox.limits, through outbox.producer_limits()), for a Producer that
// checks messages against those and not DefaultLimits: an operator may have
// raised or lowered them. MaxBatch, which the database does not bound, is
// DefaultLimits'.
func LoadLimits(ctx context.Context, db Querier) (Limits, error) {
	rows, err := db.Query(ctx, producerLimitsSQL)
	if err != nil {
		return Limits{}, fmt.Errorf("outbox: read the database's limits: %w", err)
	}
	l := Limits{MaxBatch: DefaultLimits.MaxBatch}
	var found bool
	for rows.Next() {
		var delaySeconds float64
		if err := rows.Scan(&l.MaxPayloadBytes, &l.MaxKeyBytes, &l.MaxHeaders, &l.MaxHeaderValueBytes, &delaySeconds); err != nil {
			rows.Close()
			return Limits{}, fmt.Errorf("outbox: read the database's limits: %w", err)
		}
		l.MaxDelay = time.Duration(delaySeconds * float64(time.Second))
		found = true
	}
	if err := rows.Err(); err != nil {
		return Limits{}, fmt.Errorf("outbox: read the database's limits: %w", err)
	}
	if !found {
		return Limits{}, errors.New("outbox: the database has no limits row (table outbox.limits is empty)")
	}
	return l, nil
}
