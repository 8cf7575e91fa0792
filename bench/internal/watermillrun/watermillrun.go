// Package watermillrun measures watermill-sql
// (github.com/ThreeDotsLabs/watermill-sql), the SQL pub/sub behind
// Watermill's outbox forwarder, on the comparison's workload: the messages
// are published to a PostgreSQL topic (DefaultPostgreSQLSchema), then one
// subscriber reads them in batches and acks each one, as the forwarder's
// handler does; the subscriber commits its offset once per batch.
package watermillrun

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
)

// Topic is the topic the messages go to.
const Topic = "usage_snapshot"

// PublishBatchSize is the messages per Publish call (one INSERT each), as
// the outbox's enqueue batch.
const PublishBatchSize = 1000

// Result is watermill-sql's run.
type Result struct {
	Messages           int
	SubscribeBatchSize int
	Publish, Consume   time.Duration
	// Consumed counts the messages consumed: all of them, unless the
	// subscriber stalled for longer than the run allowed.
	Consumed int
	// Stalled is the time the subscriber went without a message for more
	// than StallGap at a time. watermill-sql reads only rows written by
	// transactions older than the oldest transaction still running on the
	// whole server (pg_snapshot_xmin), so any long transaction in any
	// database holds it up.
	Stalled time.Duration
	Stalls  int
}

// StallGap is the longest wait between two messages that is not a stall:
// well above a batch's select.
const StallGap = 250 * time.Millisecond

// PublishRate and ConsumeRate are messages per second; ActiveRate leaves
// the stalls out.
func (r Result) PublishRate() float64 { return float64(r.Messages) / r.Publish.Seconds() }
func (r Result) ConsumeRate() float64 { return float64(r.Consumed) / r.Consume.Seconds() }
func (r Result) ActiveRate() float64 {
	return float64(r.Consumed) / (r.Consume - r.Stalled).Seconds()
}

// Run publishes spec.Messages messages, then consumes them all with
// subscribeBatch rows per query. Consume is timed from Subscribe until the
// subscriber has committed the offset of the last message. When the
// subscriber has stalled for more than maxStalled in all, Run stops and
// reports what it consumed.
func Run(ctx context.Context, db *scratch.DB, spec workload.Spec, subscribeBatch int, maxStalled time.Duration) (Result, error) {
	sqlDB, err := sql.Open("pgx", db.URL)
	if err != nil {
		return Result{}, err
	}
	defer sqlDB.Close()
	_ = stdlib.GetDefaultDriver()
	var beginner wsql.Beginner = sqlDB
	schema := wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: subscribeBatch}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{}
	logger := watermill.NopLogger{}

	pub, err := wsql.NewPublisher(beginner, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		return Result{}, err
	}
	payload := workload.Payload(spec.PayloadBytes)
	batches := make([][]*message.Message, 0, spec.Messages/PublishBatchSize+1)
	for from := 0; from < spec.Messages; from += PublishBatchSize {
		b := make([]*message.Message, 0, PublishBatchSize)
		for i := from; i < min(spec.Messages, from+PublishBatchSize); i++ {
			b = append(b, message.NewMessage(watermill.NewUUID(), message.Payload(payload)))
		}
		batches = append(batches, b)
	}
	// The first Publish creates the table; do it before the clock starts.
	if err := pub.Publish(Topic, batches[0]...); err != nil {
		return Result{}, fmt.Errorf("watermill: publish: %w", err)
	}
	start := time.Now()
	for _, b := range batches[1:] {
		if err := pub.Publish(Topic, b...); err != nil {
			return Result{}, fmt.Errorf("watermill: publish: %w", err)
		}
	}
	res := Result{Messages: spec.Messages, SubscribeBatchSize: subscribeBatch}
	// Scale the first batch's time in rather than leave it out.
	res.Publish = time.Since(start) * time.Duration(len(batches)) / time.Duration(max(len(batches)-1, 1))
	if _, err := sqlDB.ExecContext(ctx, `VACUUM ANALYZE "watermill_`+Topic+`"`); err != nil {
		return Result{}, err
	}

	sub, err := wsql.NewSubscriber(beginner, wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}, logger)
	if err != nil {
		return Result{}, err
	}
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start = time.Now()
	msgs, err := sub.Subscribe(subCtx, Topic)
	if err != nil {
		return Result{}, err
	}
	last := start
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
consume:
	for res.Consumed < spec.Messages {
		select {
		case m := <-msgs:
			m.Ack()
			res.Consumed++
			now := time.Now()
			if gap := now.Sub(last); gap > StallGap {
				res.Stalled += gap
				res.Stalls++
			}
			last = now
		case <-ticker.C:
			if gap := time.Since(last); gap > StallGap && res.Stalled+gap > maxStalled {
				res.Stalled += gap
				res.Stalls++
				break consume
			}
		}
	}
	if res.Consumed < spec.Messages {
		res.Consume = time.Since(start)
		cancel()
		_ = sub.Close()
		return res, nil
	}
	// The last batch's offset is committed once its last message is acked:
	// wait for the committed offset to reach the last message.
	var lastOffset int64
	if err := sqlDB.QueryRowContext(ctx, `SELECT max("offset") FROM "watermill_`+Topic+`"`).Scan(&lastOffset); err != nil {
		return Result{}, err
	}
	for {
		var acked int64
		if err := sqlDB.QueryRowContext(ctx, `SELECT coalesce(max(offset_acked), 0) FROM "watermill_offsets_`+Topic+`"`).Scan(&acked); err != nil {
			return Result{}, err
		}
		if acked >= lastOffset {
			break
		}
		if time.Since(start) > 5*time.Minute {
			return Result{}, fmt.Errorf("watermill: the offset stopped at %d of %d", acked, lastOffset)
		}
		time.Sleep(time.Millisecond)
	}
	res.Consume = time.Since(start)
	cancel()
	_ = sub.Close()
	return res, nil
}
