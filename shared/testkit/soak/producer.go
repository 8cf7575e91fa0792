package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/outbox"
)

// ledgerSQL is the business side of the soak: every message announces one
// ledger row, written in the same transaction. The row is also how a
// producer whose commit failed finds out whether it committed.
const ledgerSQL = `
CREATE SCHEMA shop;
CREATE TABLE shop.ledger (
    pid        text PRIMARY KEY,
    account    text NOT NULL,
    amount     bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);`

// sent is one message as its producer knows it.
type sent struct {
	id       uuid.UUID
	orderKey string
	seq      int64
}

// ledgerBook is what the producers did, shared by all of them.
type ledgerBook struct {
	mu sync.Mutex
	// committed are the messages whose transaction committed.
	committed map[uuid.UUID]sent
	// rolledBack are the messages enqueued in a transaction rolled back on
	// purpose; notCommitted those whose transaction failed (before or at
	// commit) and, checked afterwards, did not commit.
	rolledBack   map[uuid.UUID]struct{}
	notCommitted map[uuid.UUID]struct{}
	// dedupeKeys of committed messages, for deliberate re-enqueues.
	dedupeKeys []dedupeRef

	committedCount atomic.Int64
	stats          ProducerCounts
}

type dedupeRef struct {
	namespace, topic, key string
	id                    uuid.UUID
}

// ProducerCounts are what the producers did.
type ProducerCounts struct {
	Transactions         int64 `json:"transactions"`
	Committed            int64 `json:"committed_messages"`
	RolledBackTx         int64 `json:"rolled_back_transactions"`
	RolledBack           int64 `json:"rolled_back_messages"`
	FailedBeforeCommit   int64 `json:"failed_before_commit_transactions"`
	CommitErrors         int64 `json:"commit_errors"`
	CommitErrorCommitted int64 `json:"commit_errors_found_committed"`
	CommitErrorLost      int64 `json:"commit_errors_found_not_committed"`
	NotCommitted         int64 `json:"not_committed_messages"`
	Ordered              int64 `json:"messages_with_ordering_key"`
	Deduped              int64 `json:"messages_with_dedupe_key"`
	ReEnqueued           int64 `json:"deliberate_dedupe_hits"`
	ReEnqueueInserted    int64 `json:"dedupe_hits_inserted_anew"`
	AtomicityViolations  int64 `json:"atomicity_violations"`
}

func newLedgerBook(n int) *ledgerBook {
	return &ledgerBook{
		committed:    make(map[uuid.UUID]sent, n),
		rolledBack:   map[uuid.UUID]struct{}{},
		notCommitted: map[uuid.UUID]struct{}{},
	}
}

// producers run the business transactions until target messages committed.
type producers struct {
	cfg    Config
	pool   *pgxpool.Pool
	book   *ledgerBook
	budget atomic.Int64 // messages still to commit, minus those in flight
	// paced, when set, blocks a producer while the backlog is too deep.
	paced func(ctx context.Context) error
	log   func(format string, args ...any)
}

func (p *producers) run(ctx context.Context) error {
	p.budget.Store(int64(p.cfg.Messages))
	var wg sync.WaitGroup
	errs := make(chan error, p.cfg.Producers)
	for i := range p.cfg.Producers {
		wg.Go(func() {
			if err := p.loop(ctx, i); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return errors.Join(collect(errs)...)
}

func collect(ch chan error) []error {
	var out []error
	for err := range ch {
		out = append(out, err)
	}
	return out
}

func (p *producers) loop(ctx context.Context, producer int) error {
	seq := 0
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.book.committedCount.Load() >= int64(p.cfg.Messages) {
			return nil
		}
		if p.paced != nil {
			if err := p.paced(ctx); err != nil {
				return err
			}
		}
		k := 1 + rand.IntN(p.cfg.MaxTxMessages)
		if rand.IntN(4) == 0 {
			k = 1 // single enqueues too, not only batches
		}
		if left := p.budget.Add(-int64(k)); left < 0 {
			// Take only what is left; give back the rest.
			p.budget.Add(int64(min(k, int(-left))))
			k += int(left)
			if k <= 0 {
				// Others hold the rest in flight; wait for their outcome.
				time.Sleep(20 * time.Millisecond)
				continue
			}
		}
		committed, err := p.transaction(ctx, producer, &seq, k)
		if !committed {
			p.budget.Add(int64(k))
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The database is restarting, most likely: back off and go on.
			time.Sleep(time.Duration(50+rand.IntN(200)) * time.Millisecond)
		}
	}
}

type draft struct {
	pid     string
	account string
	amount  int64
	msg     outbox.Message
}

// transaction runs one business transaction of k messages and records its
// fate. It reports whether it committed.
func (p *producers) transaction(ctx context.Context, producer int, seq *int, k int) (bool, error) {
	drafts := make([]draft, k)
	for i := range drafts {
		*seq++
		d := &drafts[i]
		d.pid = fmt.Sprintf("p%d-%d", producer, *seq)
		d.account = fmt.Sprintf("acct-%d", rand.IntN(p.cfg.Keys))
		d.amount = int64(1 + rand.IntN(100_000))
		topic := "usage_record"
		if rand.IntN(2) == 0 {
			topic = "transfer"
		}
		payload, _ := json.Marshal(map[string]any{"pid": d.pid, "account": d.account, "amount": d.amount})
		d.msg = outbox.Message{Namespace: "payments", Topic: topic, Payload: payload, TenantID: "tenant-" + d.account}
		if rand.Float64() < p.cfg.OrderedShare {
			d.msg.OrderingKey = "payments:" + d.account
		}
		if rand.Float64() < p.cfg.DedupeShare {
			d.msg.DedupeKey = d.account + "/" + d.pid
		}
	}
	rollback := rand.Float64() < p.cfg.RollbackRate
	var reenqueue *dedupeRef
	if !rollback && rand.Float64() < 0.02 {
		p.book.mu.Lock()
		if n := len(p.book.dedupeKeys); n > 0 {
			ref := p.book.dedupeKeys[rand.IntN(n)]
			reenqueue = &ref
		}
		p.book.mu.Unlock()
	}

	pids := make([]string, k)
	accounts := make([]string, k)
	amounts := make([]int64, k)
	msgs := make([]outbox.Message, k)
	for i, d := range drafts {
		pids[i], accounts[i], amounts[i], msgs[i] = d.pid, d.account, d.amount, d.msg
	}
	p.book.add(func(s *ProducerCounts) { s.Transactions++ })

	txCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tx, err := p.pool.Begin(txCtx)
	if err != nil {
		p.book.add(func(s *ProducerCounts) { s.FailedBeforeCommit++ })
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(txCtx)) //nolint:errcheck // a no-op after Commit
	var results []outbox.Enqueued
	fail := func(err error) (bool, error) {
		_ = tx.Rollback(context.WithoutCancel(txCtx))
		p.book.notCommittedBatch(results, func(s *ProducerCounts) { s.FailedBeforeCommit++ })
		return false, err
	}
	if _, err := tx.Exec(txCtx, `INSERT INTO shop.ledger (pid, account, amount) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`,
		pids, accounts, amounts); err != nil {
		return fail(err)
	}
	if k == 1 {
		var r outbox.Enqueued
		r, err = outbox.Enqueue(txCtx, tx, msgs[0])
		results = []outbox.Enqueued{r}
	} else {
		results, err = outbox.EnqueueBatch(txCtx, tx, msgs)
	}
	if err != nil {
		results = nil
		return fail(err)
	}
	if reenqueue != nil {
		// The same dedupe key again, in a later transaction: it must answer
		// the first message's id and write nothing.
		r, err := outbox.Enqueue(txCtx, tx, outbox.Message{Namespace: reenqueue.namespace, Topic: reenqueue.topic,
			DedupeKey: reenqueue.key, Payload: json.RawMessage(`{"again":true}`)})
		if err != nil {
			return fail(err)
		}
		p.book.add(func(s *ProducerCounts) {
			s.ReEnqueued++
			if r.Inserted || r.ID != reenqueue.id {
				s.ReEnqueueInserted++
			}
		})
	}
	if rollback {
		err := tx.Rollback(txCtx)
		if err != nil {
			// A failed ROLLBACK still commits nothing.
			p.book.notCommittedBatch(results, func(s *ProducerCounts) { s.FailedBeforeCommit++ })
			return false, err
		}
		p.book.rolledBackBatch(results)
		return false, nil
	}
	if err := tx.Commit(txCtx); err != nil {
		// The connection may have died after the server committed: the
		// ledger rows say which it was.
		committed, checkErr := p.resolve(ctx, pids)
		p.book.add(func(s *ProducerCounts) { s.CommitErrors++ })
		switch {
		case checkErr != nil:
			return false, fmt.Errorf("soak: producer %d: commit failed (%v) and its outcome could not be established: %w", producer, err, checkErr)
		case committed:
			p.book.committedBatch(drafts, results, func(s *ProducerCounts) { s.CommitErrorCommitted++ })
			return true, nil
		default:
			p.book.notCommittedBatch(results, func(s *ProducerCounts) { s.CommitErrorLost++ })
			return false, err
		}
	}
	p.book.committedBatch(drafts, results, nil)
	return true, nil
}

// resolve finds out whether a transaction whose COMMIT failed committed,
// from its ledger rows: all of them or none, or the transaction was torn.
func (p *producers) resolve(ctx context.Context, pids []string) (bool, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var n int
		err := p.pool.QueryRow(ctx, `SELECT count(*) FROM shop.ledger WHERE pid = ANY($1)`, pids).Scan(&n)
		if err == nil {
			switch n {
			case len(pids):
				return true, nil
			case 0:
				return false, nil
			default:
				p.book.add(func(s *ProducerCounts) { s.AtomicityViolations++ })
				return false, fmt.Errorf("%d of the transaction's %d ledger rows exist", n, len(pids))
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (b *ledgerBook) add(f func(*ProducerCounts)) {
	b.mu.Lock()
	f(&b.stats)
	b.mu.Unlock()
}

func (b *ledgerBook) committedBatch(drafts []draft, results []outbox.Enqueued, count func(*ProducerCounts)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, r := range results {
		m := drafts[i].msg
		b.committed[r.ID] = sent{id: r.ID, orderKey: m.OrderingKey, seq: r.SequenceID}
		if m.OrderingKey != "" {
			b.stats.Ordered++
		}
		if m.DedupeKey != "" {
			b.stats.Deduped++
			b.dedupeKeys = append(b.dedupeKeys, dedupeRef{namespace: m.Namespace, topic: m.Topic, key: m.DedupeKey, id: r.ID})
		}
	}
	b.stats.Committed += int64(len(results))
	if count != nil {
		count(&b.stats)
	}
	b.committedCount.Add(int64(len(results)))
}

func (b *ledgerBook) rolledBackBatch(results []outbox.Enqueued) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range results {
		b.rolledBack[r.ID] = struct{}{}
	}
	b.stats.RolledBackTx++
	b.stats.RolledBack += int64(len(results))
}

func (b *ledgerBook) notCommittedBatch(results []outbox.Enqueued, count func(*ProducerCounts)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range results {
		b.notCommitted[r.ID] = struct{}{}
	}
	b.stats.NotCommitted += int64(len(results))
	if count != nil {
		count(&b.stats)
	}
}

// openPool opens a pool that survives server restarts: broken connections
// are dropped and replaced on the next acquire.
func openPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	cfg.HealthCheckPeriod = time.Second
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	return pgxpool.NewWithConfig(ctx, cfg)
}
