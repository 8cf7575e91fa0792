package lease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// payload512 is a realistic usage snapshot of about 512 bytes.
var payload512 = json.RawMessage(fmt.Sprintf(`{"tenant_id":"tenant-42","turn_id":"turn-1","request_id":"req-1","model":"m-large","tokens_in":1200,"tokens_out":340,"policy_version_applied":7,"pad":%q}`,
	strings.Repeat("x", 512-170)))

// BenchmarkClaimCompleteCycle measures the full dispatcher cycle against the
// database — claim a batch, complete every message as dispatched — with no
// target in between, so it shows what the outbox itself costs. It reports
// messages per second, and the client's CPU per message; compare with a
// Postgres job queue working no-op jobs.
func BenchmarkClaimCompleteCycle(b *testing.B) {
	for _, workers := range []int{1, 2} {
		for _, size := range []int{1, 100, 1000} {
			b.Run(fmt.Sprintf("batch=%d/workers=%d", size, workers), func(b *testing.B) {
				db := pgtest.NewWithConfig(b, func(cfg *pgxpool.Config) { cfg.MaxConns = int32(workers + 1) })
				ctx := context.Background()
				total := b.N * size * workers
				enqueue(b, db.Pool, total, func(i int) outbox.Message {
					return outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: fmt.Sprintf("k-%d", i), Payload: payload512}
				})
				if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE outbox.pending"); err != nil {
					b.Fatal(err)
				}
				runtime.GC() // the enqueue's garbage is not the cycle's
				b.ResetTimer()
				cpu := processCPU(b)
				var wg sync.WaitGroup
				for w := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						store := lease.NewStore(db.Pool)
						worker := fmt.Sprintf("bench-%d", w)
						for range b.N {
							msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: worker, BatchSize: size, Lease: time.Minute})
							if err != nil {
								b.Error(err)
								return
							}
							if _, err := store.CompleteBatch(ctx, worker, dispatched(msgs)); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "msgs/s")
				b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/1e3/float64(total), "client-µs/msg")
			})
		}
	}
}

// BenchmarkClaimCompleteTimeouts measures what setting the timeouts per
// transaction costs the cycle of BenchmarkClaimCompleteCycle (one worker),
// on pools as dbpool.Open builds them against the server itself:
// pooler=none (the timeouts as startup parameters) with pgx's statement
// cache and with the simple protocol, and pooler=transaction (the simple
// protocol, and SET LOCAL statement_timeout sent with each statement).
// Compare pooler=transaction with pooler=none/simple: the protocol is the
// same, and the difference is the added statement.
func BenchmarkClaimCompleteTimeouts(b *testing.B) {
	for _, mode := range []struct {
		name string
		cfg  dbpool.Config
	}{
		{"pooler=none/cache", dbpool.Config{}},
		{"pooler=none/simple", dbpool.Config{SimpleProtocol: true}},
		{"pooler=transaction", dbpool.Config{Pooler: dbpool.PoolerTransaction}},
	} {
		for _, size := range []int{1, 100, 1000} {
			b.Run(fmt.Sprintf("%s/batch=%d", mode.name, size), func(b *testing.B) {
				db := pgtest.New(b)
				ctx := context.Background()
				total := b.N * size
				enqueue(b, db.Pool, total, func(i int) outbox.Message {
					return outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: fmt.Sprintf("k-%d", i), Payload: payload512}
				})
				if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE outbox.pending"); err != nil {
					b.Fatal(err)
				}
				cfg := mode.cfg
				cfg.Source, cfg.DatabaseURL = dbpool.SourceURL, dbpool.ConnString(db.URL)
				pool, err := dbpool.Open(ctx, cfg, dbpool.Deps{})
				if err != nil {
					b.Fatal(err)
				}
				defer pool.Close()
				store := lease.NewStore(pool)
				runtime.GC()
				b.ResetTimer()
				cpu := processCPU(b)
				for range b.N {
					msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "bench", BatchSize: size, Lease: time.Minute})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := store.CompleteBatch(ctx, "bench", dispatched(msgs)); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "msgs/s")
				b.ReportMetric(float64((processCPU(b)-cpu).Nanoseconds())/1e3/float64(total), "client-µs/msg")
			})
		}
	}
}

// processCPU is the CPU time this process has used: in a benchmark of the
// store, the client's side of its calls (decoding, encoding, the driver,
// the collector), which shares a small machine's cores with the database.
func processCPU(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// BenchmarkClaimOfOrderedKeys measures one claim of 1,000 against queues of
// 50,000 messages that differ only in their ordering keys: none, 2,000
// keys of 25 messages (a claim takes 40 keys' runs), and 50,000 keys of one
// message (per-entity keys: every head stands alone). Each claim is rolled
// back, so that every iteration claims from the same queue.
func BenchmarkClaimOfOrderedKeys(b *testing.B) {
	const messages, batch = 50_000, 1000
	for _, keys := range []int{0, 2000, messages} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			db := pgtest.New(b)
			ctx := context.Background()
			enqueue(b, db.Pool, messages, func(i int) outbox.Message {
				m := outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: fmt.Sprintf("k-%d", i), Payload: payload512}
				if keys > 0 {
					m.OrderingKey = fmt.Sprintf("acct-%d", i%keys)
				}
				return m
			})
			if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE outbox.pending"); err != nil {
				b.Fatal(err)
			}
			conn, err := db.Pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			b.ResetTimer()
			for range b.N {
				tx, err := conn.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				msgs, err := lease.NewStore(tx).ClaimBatch(ctx, lease.ClaimParams{WorkerID: "bench", BatchSize: batch, MaxRun: 100, Lease: time.Minute})
				if err != nil {
					b.Fatal(err)
				}
				if len(msgs) != batch {
					b.Fatalf("claimed %d, want %d", len(msgs), batch)
				}
				if err := tx.Rollback(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
