package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/outbox"
)

// ProducerConfig is the offered load.
type ProducerConfig struct {
	// Pool connects the producers (one connection per worker is enough).
	Pool *pgxpool.Pool
	// Rate is the messages offered per second.
	Rate float64
	// MessagesPerTx is the size of each transaction (default 5): small
	// transactions, as services commit their business writes. One is
	// written with outbox.Enqueue, more with outbox.EnqueueBatch.
	MessagesPerTx int
	// Workers run transactions side by side (default 8), so that one slow
	// commit does not hold the others back.
	Workers int
	// Message builds message n (from 0); default: namespace "bench",
	// topic "event", a 200-byte JSON payload.
	Message func(n int64) outbox.Message
	// Ledger receives every committed message's commit time.
	Ledger *Ledger
}

// ProducerStats are what the producers did.
type ProducerStats struct {
	Transactions, Messages int64
	// Elapsed is from the first transaction's due time to the last commit.
	Elapsed time.Duration
	// MaxLag is the longest a transaction started after it was due: the
	// producers (or the database) falling behind the offered rate.
	MaxLag time.Duration
}

// OfferedRate is the messages committed per second.
func (s ProducerStats) OfferedRate() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Messages) / s.Elapsed.Seconds()
}

// Produce commits transactions at the configured rate until ctx ends; a
// transaction that fails ends the run with its error.
func Produce(ctx context.Context, cfg ProducerConfig) (ProducerStats, error) {
	if cfg.Pool == nil || cfg.Ledger == nil || cfg.Rate <= 0 {
		return ProducerStats{}, errors.New("workload: Produce needs a Pool, a Ledger and a positive Rate")
	}
	if cfg.MessagesPerTx == 0 {
		cfg.MessagesPerTx = 5
	}
	if cfg.Workers == 0 {
		cfg.Workers = 8
	}
	if cfg.Message == nil {
		cfg.Message = DefaultMessage
	}
	interval := time.Duration(float64(cfg.MessagesPerTx) / cfg.Rate * float64(time.Second))
	start := time.Now()

	due := make(chan time.Time, 1024)
	var (
		mu       sync.Mutex
		stats    ProducerStats
		lastEnd  time.Time
		firstErr error
		next     atomic.Int64
	)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Go(func() {
			for at := range due {
				lag := time.Since(at)
				first := next.Add(int64(cfg.MessagesPerTx)) - int64(cfg.MessagesPerTx)
				err := commitOne(runCtx, cfg, first)
				mu.Lock()
				stats.MaxLag = max(stats.MaxLag, lag)
				switch {
				case err == nil:
					stats.Transactions++
					stats.Messages += int64(cfg.MessagesPerTx)
					lastEnd = time.Now()
				case runCtx.Err() == nil && firstErr == nil:
					firstErr = err
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	for k := 0; ; k++ {
		at := start.Add(time.Duration(k) * interval)
		timer := time.NewTimer(time.Until(at))
		select {
		case <-runCtx.Done():
			timer.Stop()
			close(due)
			wg.Wait()
			if !lastEnd.IsZero() {
				stats.Elapsed = lastEnd.Sub(start)
			}
			return stats, firstErr
		case <-timer.C:
		}
		select {
		case due <- at:
		case <-runCtx.Done():
		}
	}
}

// commitOne runs one transaction of cfg.MessagesPerTx messages, numbered
// from first, and notes its commit time.
// A transaction once begun runs to its end, whatever ctx does: one cut
// short at COMMIT may or may not have committed, and the ledger must know.
func commitOne(ctx context.Context, cfg ProducerConfig, first int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	msgs := make([]outbox.Message, cfg.MessagesPerTx)
	for i := range msgs {
		msgs[i] = cfg.Message(first + int64(i))
	}
	tx, err := cfg.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("workload: begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	var ids []uuid.UUID
	if len(msgs) == 1 {
		out, err := outbox.Enqueue(ctx, tx, msgs[0])
		if err != nil {
			return err
		}
		ids = []uuid.UUID{out.ID}
	} else {
		outs, err := outbox.EnqueueBatch(ctx, tx, msgs)
		if err != nil {
			return err
		}
		for _, o := range outs {
			ids = append(ids, o.ID)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("workload: commit: %w", err)
	}
	cfg.Ledger.Committed(time.Now(), ids...)
	return nil
}

// DefaultMessage is message n of the default workload.
func DefaultMessage(n int64) outbox.Message {
	payload, _ := json.Marshal(map[string]any{
		"order": n, "status": "paid", "amount_cents": 1000 + n%9000, "currency": "EUR",
		"note": "a payload of about two hundred bytes, as a small business event carries",
	})
	return outbox.Message{Namespace: "bench", Topic: "order_paid", TenantID: fmt.Sprintf("tenant-%d", n%16), Payload: payload}
}

// CommitBacklog commits n messages of the default workload in
// transactions of 1,000, as fast as the database takes them, and notes
// their commit times.
func CommitBacklog(ctx context.Context, pool *pgxpool.Pool, ledger *Ledger, n int) error {
	const perTx = 1000
	for first := 0; first < n; first += perTx {
		cfg := ProducerConfig{Pool: pool, MessagesPerTx: min(perTx, n-first), Message: DefaultMessage, Ledger: ledger}
		if err := commitOne(ctx, cfg, int64(first)); err != nil {
			return err
		}
	}
	return nil
}
