package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// The invariants of ordered delivery under everything at once: producers
// enqueueing, dispatchers claiming runs and completing them with random
// outcomes (and sometimes dying with their leases held, or stalling past
// them), their claims taking over the leases that expired, the reaper
// sweeping behind them, and operators replaying dead letters of some keys
// and discarding those of others. Half the keys park on a dead head,
// half skip it. A sampler watches the queue all along. At the end:
//
//   - no sample ever saw two claims in flight on one key;
//   - every key under park was dispatched in sequence order;
//   - every message was dispatched exactly once or discarded, none lost,
//     and some were discarded.
func TestRaceOfClaimCompleteRepairAndReplay(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a 20-second race")
	}
	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 16 })
	ctx := context.Background()
	const (
		keys    = 300
		initial = 10 // messages per key at the start
		chaos   = 8 * time.Second
		// stalled is how long the drain may go without settling a
		// message before the test gives up: a ceiling on a stuck queue,
		// not on a slow machine's drain.
		stalled   = 90 * time.Second
		leaseTime = 2 * time.Second
	)
	parks := func(key string) bool { return key[len(key)-1]%2 == 0 }
	keyName := func(i int) string { return fmt.Sprintf("acct-%03d", i) }
	// A quarter of the keys (all of them parking) carry topic "disputed":
	// their dead letters are the discarder's, every other key's the
	// replayer's, so that neither takes all the work from the other.
	topicOf := func(key string) string {
		var i int
		fmt.Sscanf(key, "acct-%d", &i)
		if i%4 == 0 {
			return "disputed"
		}
		return "captured"
	}

	var enqueued, discarded sync.Map // id → struct{}
	produce := func(n int, key func(i int) string) error {
		var batch []outbox.Message
		for i := range n {
			m := plain(i)
			m.Namespace, m.OrderingKey = "payments", key(i)
			m.Topic = topicOf(m.OrderingKey)
			batch = append(batch, m)
		}
		res, err := outbox.EnqueueBatch(ctx, db.Pool, batch)
		for _, r := range res {
			enqueued.Store(r.ID, struct{}{})
		}
		return err
	}
	for round := range initial {
		_ = round
		if err := produce(keys, keyName); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	inChaos := func() bool { return time.Since(start) < chaos }
	var (
		stop       = make(chan struct{})
		wg         sync.WaitGroup
		errs       = make(chan error, 64)
		samples    atomic.Int64
		violations atomic.Int64
		crashes    atomic.Int64
		replays    atomic.Int64
		released   atomic.Int64
	)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	every := func(period time.Duration, f func(rng *rand.Rand) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
			for {
				select {
				case <-stop:
					return
				case <-time.After(period):
				}
				if err := f(rng); err != nil {
					fail(err)
					return
				}
			}
		}()
	}

	// Producers: more messages for random keys during the chaos.
	every(20*time.Millisecond, func(rng *rand.Rand) error {
		if !inChaos() {
			return nil
		}
		return produce(10, func(int) string { return keyName(rng.IntN(keys)) })
	})

	// Dispatchers.
	for w := range 4 {
		worker := fmt.Sprintf("dispatcher-%d", w)
		store := lease.NewStore(db.Pool)
		every(time.Millisecond, func(rng *rand.Rand) error {
			msgs, err := store.ClaimBatch(ctx, lease.ClaimParams{WorkerID: worker, BatchSize: 40, MaxRun: 5, Lease: leaseTime})
			if err != nil || len(msgs) == 0 {
				return err
			}
			if inChaos() && rng.IntN(20) == 0 {
				crashes.Add(1) // dies holding the leases
				return nil
			}
			results := make([]lease.Result, len(msgs))
			stopped := map[string]bool{}
			for i, m := range msgs {
				r := lease.Result{ID: m.ID, LeaseToken: m.LeaseToken, Outcome: outboxtype.OutcomeDispatched, OnDead: outboxtype.OnDeadSkip}
				if parks(m.OrderingKey) {
					r.OnDead = outboxtype.OnDeadPark
				}
				switch roll := rng.IntN(100); {
				case stopped[m.OrderingKey]:
					r.Outcome = outboxtype.OutcomeReleased
					released.Add(1)
				case inChaos() && roll < 12:
					r.Outcome, r.ErrorCode = outboxtype.OutcomeRetryable, "TARGET_5XX"
				case inChaos() && roll < 16:
					r.Outcome, r.ErrorCode = outboxtype.OutcomeFailed, "TARGET_REJECTED"
				}
				if r.Outcome != outboxtype.OutcomeDispatched {
					stopped[m.OrderingKey] = true
				}
				results[i] = r
			}
			if inChaos() && rng.IntN(10) == 0 {
				time.Sleep(leaseTime) // stalls past its lease: completions come back lease_lost
			}
			_, err = store.CompleteBatch(ctx, worker, results)
			return err
		})
	}

	// The reaper, racing the claims' takeovers.
	reaper := lease.NewStore(db.Pool)
	every(100*time.Millisecond, func(*rand.Rand) error {
		_, err := reaper.RepairExpiredLeases(ctx, "reaper", 1000)
		return err
	})

	// An operator replaying dead letters of topic "captured", a few at a
	// time.
	operator := lease.NewStore(db.Pool)
	every(50*time.Millisecond, func(rng *rand.Rand) error {
		ids, err := operator.ReplayDead(ctx, lease.ReplayRequest{Namespace: "payments", Topic: "captured",
			Limit: 1 + rng.IntN(20), Operator: "race", Reason: "race"})
		replays.Add(int64(len(ids)))
		return err
	})

	// An operator discarding dead letters of topic "disputed" (mostly heads
	// that park their keys), a few at a time; a discarded message is
	// accounted for as such.
	every(50*time.Millisecond, func(rng *rand.Rand) error {
		dead, err := operator.ListDead(ctx, lease.DeadFilter{Namespace: "payments", Topic: "disputed", Limit: 1 + rng.IntN(20)})
		if err != nil || len(dead.Letters) == 0 {
			return err
		}
		ids := make([]uuid.UUID, len(dead.Letters))
		for i, d := range dead.Letters {
			ids[i] = d.ID
		}
		gone, err := operator.Discard(ctx, lease.DiscardRequest{MessageIDs: ids, Reason: "race", Operator: "race"})
		for _, d := range gone {
			discarded.Store(d.ID, struct{}{})
		}
		return err
	})

	// The sampler: two distinct lease tokens on one key's leased rows are
	// two claims in flight.
	every(5*time.Millisecond, func(*rand.Rand) error {
		var n int64
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM (
			SELECT 1 FROM outbox.pending WHERE lease_token IS NOT NULL AND ordering_key IS NOT NULL
			GROUP BY namespace, ordering_key HAVING count(DISTINCT lease_token) > 1) x`).Scan(&n)
		samples.Add(1)
		violations.Add(n)
		return err
	})

	// Until everything is delivered (or the test gives up).
	fewest, progressed := -1, time.Now()
	for {
		time.Sleep(200 * time.Millisecond)
		select {
		case err := <-errs:
			close(stop)
			wg.Wait()
			t.Fatal(err)
		default:
		}
		if inChaos() {
			continue
		}
		left := count(t, db.Pool, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.dead)`)
		if left == 0 {
			break
		}
		if fewest < 0 || left < fewest {
			fewest, progressed = left, time.Now()
		}
		if time.Since(progressed) > stalled {
			close(stop)
			wg.Wait()
			blocked, _ := reaper.BlockedKeys(ctx, "", 5)
			t.Fatalf("%d messages still pending or dead, none settled for %s; blocked keys: %+v", left, stalled, blocked)
		}
	}
	close(stop)
	wg.Wait()

	if v := violations.Load(); v != 0 {
		t.Errorf("%d samples saw two claims in flight on one key", v)
	}
	// Dispatched in sequence order, per parked key, in the order the
	// outcomes were recorded (one claim per key: that is delivery order).
	rows, err := db.Pool.Query(ctx, `SELECT ordering_key, sequence_id FROM outbox.attempts WHERE state = 'DISPATCHED' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	outOfOrder, skipReorders := 0, 0
	for rows.Next() {
		var key string
		var seq int64
		if err := rows.Scan(&key, &seq); err != nil {
			t.Fatal(err)
		}
		if seq < last[key] {
			if parks(key) {
				outOfOrder++
				if outOfOrder < 5 {
					t.Errorf("key %s (park) dispatched sequence %d after %d", key, seq, last[key])
				}
			} else {
				skipReorders++ // a skipped dead message, replayed later: allowed under skip
			}
		}
		last[key] = max(last[key], seq)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if outOfOrder > 0 {
		t.Errorf("%d dispatches out of sequence order on parked keys", outOfOrder)
	}

	// Every message dispatched exactly once.
	dispatchedOnce := map[uuid.UUID]int{}
	rows, err = db.Pool.Query(ctx, `SELECT message_id, count(*) FROM outbox.attempts WHERE state = 'DISPATCHED' GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		dispatchedOnce[id] = n
	}
	total, missing, gone, discards := 0, 0, 0, 0
	discarded.Range(func(any, any) bool { discards++; return true })
	enqueued.Range(func(k, _ any) bool {
		total++
		_, wasDiscarded := discarded.Load(k)
		switch n := dispatchedOnce[k.(uuid.UUID)]; {
		case wasDiscarded && n == 0:
			gone++
		case n != 1 || wasDiscarded:
			missing++
		}
		return true
	})
	if missing > 0 || len(dispatchedOnce)+gone != total || gone != discards {
		t.Errorf("%d of %d messages neither dispatched exactly once nor discarded (%d dispatched, %d of %d discards accounted for)",
			missing, total, len(dispatchedOnce), gone, discards)
	}
	if gone == 0 {
		t.Errorf("nothing was discarded: the race never exercised discard")
	}
	takenOver := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE' AND worker_id LIKE 'dispatcher-%'`)
	reaped := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE' AND worker_id = 'reaper'`)
	if takenOver == 0 {
		t.Errorf("no claim took over an expired lease: the race never exercised the takeover")
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISCARDED'`); n != gone {
		t.Errorf("%d DISCARDED outcomes archived for %d discards", n, gone)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'REPLAYED' AND topic = 'disputed'`); n != 0 {
		t.Errorf("%d replays of the discarder's messages: the test no longer splits the work", n)
	}
	t.Logf("%d messages on %d keys: %d samples, %d crashes, %d taken over by claims and %d by the reaper, %d replays, %d discarded, %d released, %d skip-key reorders after replays, in %s",
		total, keys, samples.Load(), crashes.Load(), takenOver, reaped, replays.Load(), gone, released.Load(), skipReorders, time.Since(start).Round(time.Second))
}
