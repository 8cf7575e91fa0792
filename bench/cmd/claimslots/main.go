// Command claimslots measures a claim the queue does not use, to answer
// whether it should: concurrent claims on disjoint slots of the queue
// instead of all at the head of one index. With several connections
// claiming at once, each claim of the bare-SQL floor (and of
// outbox.claim_batch) starts at the head of pending_claimable and steps over
// the rows the other claims hold or have just leased — about five entries
// of that index read a message claimed on four connections, two on one. A
// claim slot (here a column — hashtext(id) modulo the slot count, or with
// -slot-by chunk the heap's run of -chunk-pages pages the row was enqueued
// into, so that a slot's rows lie together — and an index on (claim_slot,
// next_attempt_at, id) with pending_claimable's predicate)
// lets each connection claim from a slot of its own, and turn to the others
// only when its own is empty (-start owned, one call a slot): the best
// slotting can do, since no two claims share a slot while each
// connection's own has rows. A dispatcher has no slot of its own, so
// -start random is what a claim function could do: start at a random slot,
// and read the next ones in turn until the batch is full (one statement a
// slot, as a loop in the function would run them; -one-statement reads
// them all in one, a lateral join of the slots with each one's locked
// heads). docs/PERFORMANCE.md says what they found.
//
// Both shapes run the floor's statements (bench/internal/floor) on copies of
// one template, each copy keeping only the claim index its shape reads, in
// pairs whose order alternates round by round. It prints the rate and the
// CPU the database's backends spent a message, and the claim-index entries
// read a message claimed.
//
//	go run ./cmd/claimslots                   # from bench/: 4 connections on 4 slots, 5 rounds, a throwaway cluster
//	go run ./cmd/claimslots -slots 16 -start random
//	go run ./cmd/claimslots -cluster host     # the server at -database-url
//
// It prints figures, and fails only when a run does not drain its queue.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/bench/internal/floor"
	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "claimslots:", err)
		os.Exit(1)
	}
}

// slotClaimSQL is the floor's claim restricted to one slot ($3).
var slotClaimSQL = func() string {
	const due = "AND p.next_attempt_at <= now()"
	if !strings.Contains(floor.ClaimSQL, due) {
		panic("claimslots: the floor's claim no longer reads " + due)
	}
	return strings.Replace(floor.ClaimSQL, due, due+" AND p.claim_slot = $3::int", 1)
}()

// lateralClaimSQL is the floor's claim over every slot in one statement,
// from slot $3 on: each slot's heads in turn until the batch is full.
var lateralClaimSQL = strings.Replace(floor.ClaimSQL, `WITH heads AS (
    SELECT p.id
    FROM outbox.pending p
    WHERE p.lease_token IS NULL
      AND NOT p.behind
      AND NOT p.paused
      AND p.next_attempt_at <= now()
    ORDER BY p.next_attempt_at, p.id
    LIMIT $2
    FOR UPDATE OF p SKIP LOCKED
)`, `WITH heads AS (
    SELECT h.id
    FROM generate_series(0, $4::int - 1) AS g(k)
    CROSS JOIN LATERAL (
        SELECT p.id
        FROM outbox.pending p
        WHERE p.claim_slot = ($3::int + g.k) % $4::int
          AND p.lease_token IS NULL
          AND NOT p.behind
          AND NOT p.paused
          AND p.next_attempt_at <= now()
        ORDER BY p.next_attempt_at, p.id
        LIMIT $2
        FOR UPDATE OF p SKIP LOCKED) h
    LIMIT $2
)`, 1)

// slotIndex is the slotted claim's index: pending_claimable's predicate,
// led by the slot.
const slotIndex = "pending_slot_claimable"

func run() error {
	var (
		target     = scratch.TargetFlags()
		clients    = flag.Int("clients", 4, "connections claiming at once")
		slots      = flag.Int("slots", 4, "claim slots; client i claims slot i modulo this first")
		rounds     = flag.Int("rounds", 5, "rounds; each drains one copy of each shape")
		messages   = flag.Int("messages", 200000, "messages in the queue each run drains")
		batch      = flag.Int("batch", 1000, "rows a claim takes")
		slotBy     = flag.String("slot-by", "hash", "a message's slot: hash (of its id) or chunk (of -chunk-pages heap pages as the enqueue wrote them)")
		chunkPages = flag.Int("chunk-pages", 8, "heap pages a chunk with -slot-by chunk")
		start      = flag.String("start", "owned", "where a slotted claim starts: owned (client i at slot i) or random (a random slot a claim); it reads the next slots in turn while the batch is not full")
		lateral    = flag.Bool("one-statement", false, "read the slots in one statement (a lateral join of the slots with each one's locked heads) instead of one call a slot")
	)
	flag.Parse()
	if *start != "owned" && *start != "random" {
		return fmt.Errorf("-start: %q is neither owned nor random", *start)
	}
	if *slotBy != "hash" && *slotBy != "chunk" {
		return fmt.Errorf("-slot-by: %q is neither hash nor chunk", *slotBy)
	}
	randomStart, oneStatement = *start == "random", *lateral
	if !strings.Contains(lateralClaimSQL, "generate_series") {
		return fmt.Errorf("the floor's claim no longer reads as lateralClaimSQL expects")
	}
	if *clients < 1 || *slots < 1 || *batch < 1 {
		return fmt.Errorf("-clients, -slots and -batch must be positive")
	}
	fmt.Printf("the Go collector at GOGC=%d\n", outboxrun.PaceCollector())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	srv, stopCluster, err := target.Open(ctx)
	if err != nil {
		return err
	}
	defer stopCluster()
	fmt.Println(target.Describe())
	tmpl, err := srv.CreateMigrated(ctx, "claimslots_template")
	if err != nil {
		return err
	}
	defer tmpl.Drop()
	spec := workload.Spec{Messages: *messages, PayloadBytes: 512}
	if _, err := outboxrun.Enqueue(ctx, tmpl, spec, true); err != nil {
		return err
	}
	// The column is added after the enqueue, so VACUUM FULL leaves the
	// table as dense as an enqueue would have.
	if err := tmpl.Exec(ctx,
		"ALTER TABLE outbox.pending ADD COLUMN claim_slot int NOT NULL DEFAULT 0",
		slotUpdate(*slotBy, *chunkPages, *slots),
		"VACUUM FULL outbox.pending",
		"CREATE INDEX "+slotIndex+" ON outbox.pending (claim_slot, next_attempt_at, id) WHERE lease_token IS NULL AND NOT behind AND NOT paused",
		"VACUUM ANALYZE outbox.pending", "CHECKPOINT"); err != nil {
		return err
	}
	fmt.Printf("%d messages of %d bytes, batch %d, %d connections, %d slots by %s, start %s\n", spec.Messages, spec.PayloadBytes, *batch, *clients, *slots, *slotBy, *start)
	fmt.Printf("db µs: the CPU of the database's backends a message; reads/msg: entries of the claim's index read a message claimed\n")
	fmt.Printf("%-5s %-8s %9s %8s %9s\n", "round", "claim", "msgs/s", "db µs", "reads/msg")
	var rateRatios, cpuRatios []float64
	for round := range *rounds {
		var head, slotted measured
		order := []bool{false, true}
		if round%2 == 1 {
			order = []bool{true, false}
		}
		for _, useSlots := range order {
			m, err := drainCopy(ctx, srv, tmpl.Name, *clients, *slots, *batch, useSlots)
			if err != nil {
				return err
			}
			name := "one head"
			if useSlots {
				name, slotted = "slots", m
			} else {
				head = m
			}
			fmt.Printf("%-5d %-8s %9.0f %8.1f %9.2f\n", round+1, name, m.rate, m.cpuPerMessage, m.readsPerMessage)
		}
		rateRatios = append(rateRatios, slotted.rate/head.rate)
		cpuRatios = append(cpuRatios, slotted.cpuPerMessage/head.cpuPerMessage)
	}
	fmt.Printf("slots ÷ one head, median of %d rounds (range): rate %.3f (%.3f–%.3f), db CPU a message %.3f (%.3f–%.3f)\n",
		*rounds, median(rateRatios), slices.Min(rateRatios), slices.Max(rateRatios), median(cpuRatios), slices.Min(cpuRatios), slices.Max(cpuRatios))
	return nil
}

// slotUpdate sets each message's slot.
func slotUpdate(by string, chunkPages, slots int) string {
	if by == "chunk" {
		return fmt.Sprintf("UPDATE outbox.pending SET claim_slot = ((ctid::text::point)[0]::bigint / %d) %% %d", chunkPages, slots)
	}
	return fmt.Sprintf("UPDATE outbox.pending SET claim_slot = abs(hashtext(id::text) %% %d)", slots)
}

// randomStart is -start random; oneStatement is -one-statement.
var randomStart, oneStatement bool

type measured struct{ rate, cpuPerMessage, readsPerMessage float64 }

// drainCopy drains a fresh copy of the template whose only claim index is
// the one the shape reads.
func drainCopy(ctx context.Context, srv *scratch.Server, template string, clients, slots, batch int, useSlots bool) (measured, error) {
	db, err := srv.CreateFrom(ctx, "claimslots", template)
	if err != nil {
		return measured{}, err
	}
	defer db.Drop()
	index, unused := "pending_claimable", slotIndex
	if useSlots {
		index, unused = slotIndex, "pending_claimable"
	}
	if err := db.Exec(ctx, "DROP INDEX outbox."+unused, "VACUUM ANALYZE outbox.pending"); err != nil {
		return measured{}, err
	}
	stopMeter := db.MeterCPU(ctx)
	n, elapsed, err := drain(ctx, db, clients, slots, batch, useSlots)
	cpu := stopMeter()
	if err != nil {
		return measured{}, err
	}
	reads, err := db.IndexReads(ctx, "pending")
	if err != nil {
		return measured{}, err
	}
	return measured{
		rate:            float64(n) / elapsed.Seconds(),
		cpuPerMessage:   float64(cpu.Database.Microseconds()) / float64(n),
		readsPerMessage: float64(reads[index]) / float64(n),
	}, nil
}

// drain empties db's queue with clients connections, each looping claim →
// complete; with useSlots, client i claims slot i modulo slots, and the
// next slots in turn once its own is empty.
func drain(ctx context.Context, db *scratch.DB, clients, slots, batch int, useSlots bool) (int, time.Duration, error) {
	conns := make([]*pgconn.PgConn, clients)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	for i := range conns {
		var err error
		if conns[i], err = floor.Connect(ctx, db.URL); err != nil {
			return 0, 0, err
		}
		if _, err := conns[i].Prepare(ctx, "slot_claim", slotClaimSQL, nil); err != nil {
			return 0, 0, fmt.Errorf("prepare slot_claim: %w", err)
		}
		if _, err := conns[i].Prepare(ctx, "lateral_claim", lateralClaimSQL, nil); err != nil {
			return 0, 0, fmt.Errorf("prepare lateral_claim: %w", err)
		}
	}
	counts := make([]int, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range conns {
		wg.Go(func() {
			worker := []byte(fmt.Sprintf("slots-%d", i))
			limit := []byte(fmt.Sprint(batch))
			var ids bytes.Buffer
			var token []byte
			for {
				var n int
				var err error
				first := i % slots
				if randomStart {
					first = rand.IntN(slots)
				}
				if useSlots && oneStatement {
					n, err = floor.ClaimWith(ctx, c, "lateral_claim", [][]byte{worker, limit, []byte(fmt.Sprint(first)), []byte(fmt.Sprint(slots))}, &ids, &token)
				} else if useSlots {
					for k := range slots {
						slot := []byte(fmt.Sprint((first + k) % slots))
						if n, err = floor.ClaimWith(ctx, c, "slot_claim", [][]byte{worker, limit, slot}, &ids, &token); err != nil || n > 0 {
							break
						}
					}
				} else {
					n, err = floor.Claim(ctx, c, worker, limit, &ids, &token)
				}
				if err == nil && n > 0 {
					err = floor.Complete(ctx, c, worker, ids.Bytes(), token, n)
				}
				if err != nil || n == 0 {
					errs[i] = err
					return
				}
				counts[i] += n
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	total := 0
	for i, n := range counts {
		if errs[i] != nil {
			return 0, 0, errs[i]
		}
		total += n
	}
	if left, err := pendingLeft(ctx, db); err != nil || left != 0 {
		return 0, 0, fmt.Errorf("%d messages left undrained (%v)", left, err)
	}
	return total, elapsed, nil
}

func pendingLeft(ctx context.Context, db *scratch.DB) (int, error) {
	pool, err := db.Pool(ctx, 1)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	var left int
	err = pool.QueryRow(ctx, "SELECT count(*) FROM outbox.pending").Scan(&left)
	return left, err
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
