package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// Scenarios played through the SQL functions only (the contract every
// producer and dispatcher calls), each login granted one outbox role; the
// helpers here serve the other scenario files of the package too.

// defectLogin connects as a new login that is a member of role and
// returns the connection and the login's name.
func defectLogin(t *testing.T, db *pgtest.DB, role string) (*pgx.Conn, string) {
	t.Helper()
	connString := db.LoginAs(t, role)
	u, err := url.Parse(connString)
	if err != nil {
		t.Fatal(err)
	}
	return pgtest.Connect(t, connString), u.User.Username()
}

// defectPoll polls cond until it holds. The ceiling is generous: it is
// there to end a test whose condition never comes, not to time anything.
func defectPoll(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still not so after 2 minutes", what)
		}
		time.Sleep(5 * time.Millisecond) // between polls, not a synchronisation
	}
}

// defectSQLState is the SQLSTATE of err ("" when it carries none).
func defectSQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// defectClaimed is one row of a claim.
type defectClaimed struct {
	id      uuid.UUID
	key     string
	seq     int64
	topic   string
	token   uuid.UUID
	expires time.Time
}

func defectClaim(ctx context.Context, conn *pgx.Conn, worker string, leaseSeconds, maxRun int) ([]defectClaimed, error) {
	rows, err := conn.Query(ctx, `
		SELECT id, coalesce(ordering_key, ''), coalesce(sequence_id, 0), topic, lease_token, lease_expires_at
		FROM outbox.claim_batch(100, $1, $2, NULL, p_max_run => $3)`, worker, leaseSeconds, maxRun)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (defectClaimed, error) {
		var c defectClaimed
		err := r.Scan(&c.id, &c.key, &c.seq, &c.topic, &c.token, &c.expires)
		return c, err
	})
}

// Defect 1: a completion sent while its lease was live, made to wait on a
// row lock held by an unrelated session until the lease has expired and
// another worker's claim has taken the run over, must find every row's
// lease lost when it finally writes: it records nothing, and the new
// holder's lease is intact. The completion and the takeover must not
// deadlock either. Two locks on key k2 (whose messages the completion
// meets first) make it wait: one that keeps the takeover off k2 (today the
// two then deadlock) and one that does not (today the completion then
// dispatches acct-z seq 2 and 3 under worker B's lease, and k2 after its
// lease expired).
func TestStaleCompletionAfterTakeoverWritesNothing(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		name     string
		k2       int    // messages on k2
		lockSeq  int64  // the one locked
		lockMode string // how
	}{
		{name: "k2's head locked FOR UPDATE", k2: 1, lockSeq: 1, lockMode: "FOR UPDATE"},
		{name: "k2's second message locked FOR KEY SHARE", k2: 2, lockSeq: 2, lockMode: "FOR KEY SHARE"},
	} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			staleCompletionAfterTakeover(t, v.k2, v.lockSeq, v.lockMode)
		})
	}
}

func staleCompletionAfterTakeover(t *testing.T, k2Messages int, lockSeq int64, lockMode string) {
	db := pgtest.New(t)
	ctx := context.Background()
	producer, _ := defectLogin(t, db, "outbox_producer")
	workerA, _ := defectLogin(t, db, "outbox_dispatcher")
	workerB, _ := defectLogin(t, db, "outbox_dispatcher")
	locker := pgtest.Connect(t, db.URL) // the unrelated session
	watcher := pgtest.Connect(t, db.URL)

	// k2's messages first: they have the lowest ids, and the lowest places
	// in the table but for the heads the claim rewrites.
	for i := 1; i <= k2Messages; i++ {
		if _, err := producer.Exec(ctx, `SELECT * FROM outbox.enqueue('shop', 'orders', $1::jsonb, p_ordering_key => 'k2')`,
			fmt.Sprintf(`{"n": %d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 3; i++ {
		if _, err := producer.Exec(ctx, `SELECT * FROM outbox.enqueue('shop', 'orders', $1::jsonb, p_ordering_key => 'acct-z')`,
			fmt.Sprintf(`{"n": %d}`, i)); err != nil {
			t.Fatal(err)
		}
	}

	const leaseSeconds = 2
	claimedA, err := defectClaim(ctx, workerA, "worker-A", leaseSeconds, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(claimedA) != 3+k2Messages {
		t.Fatalf("worker A claimed %d messages, want acct-z 1..3 and k2's %d: %+v", len(claimedA), k2Messages, claimedA)
	}
	var locked defectClaimed
	ids, tokens, outcomes := []uuid.UUID{}, []uuid.UUID{}, []string{}
	for _, c := range claimedA {
		if c.key == "k2" && c.seq == lockSeq {
			locked = c
		}
		ids, tokens, outcomes = append(ids, c.id), append(tokens, c.token), append(outcomes, "DISPATCHED")
	}
	expires := claimedA[0].expires

	// The unrelated session locks a row of k2; A's completion, all
	// DISPATCHED, is sent while the lease is live and waits on it.
	lockTx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lockTx.Rollback(ctx) //nolint:errcheck
	if _, err := lockTx.Exec(ctx, `SELECT 1 FROM outbox.pending WHERE id = $1 `+lockMode, locked.id); err != nil {
		t.Fatal(err)
	}
	lockerPID, pidA := locker.PgConn().PID(), workerA.PgConn().PID()
	// (Were the machine so slow that the lease ran out before the
	// completion is sent, the completion must still record nothing.)
	type completion struct {
		status map[uuid.UUID]string
		err    error
	}
	doneA := make(chan completion, 1)
	go func() {
		rows, err := workerA.Query(ctx, `SELECT id, status FROM outbox.complete_batch('worker-A', NULL,
			p_ids => $1, p_lease_tokens => $2, p_outcomes => $3)`, ids, tokens, outcomes)
		status := map[uuid.UUID]string{}
		if err == nil {
			var id uuid.UUID
			var s string
			_, err = pgx.ForEachRow(rows, []any{&id, &s}, func() error { status[id] = s; return nil })
		}
		doneA <- completion{status, err}
	}()
	defectPoll(t, "worker A's completion to wait on the locked row", func() (bool, error) {
		var waiting bool
		err := watcher.QueryRow(ctx, `SELECT $2::int = ANY (pg_blocking_pids($1))`, pidA, lockerPID).Scan(&waiting)
		return waiting, err
	})

	// The lease expires (by the database's clock) and worker B's claim
	// takes the run over, while A's completion still waits.
	defectPoll(t, "worker A's lease to expire", func() (bool, error) {
		var expired bool
		err := watcher.QueryRow(ctx, `SELECT clock_timestamp() > $1`, expires).Scan(&expired)
		return expired, err
	})
	type claim struct {
		rows []defectClaimed
		err  error
	}
	doneB := make(chan claim, 1)
	go func() {
		rows, err := defectClaim(ctx, workerB, "worker-B", 60, 10)
		doneB <- claim{rows, err}
	}()
	// B's claim either finishes or waits for A (a fix may order the locks
	// so); either way it has done what it can before the lock goes.
	pidB := workerB.PgConn().PID()
	var claimedB claim
	bDone := false
	defectPoll(t, "worker B's claim to finish or wait", func() (bool, error) {
		select {
		case claimedB = <-doneB:
			bDone = true
			return true, nil
		default:
		}
		var waiting bool
		err := watcher.QueryRow(ctx, `SELECT cardinality(pg_blocking_pids($1)) > 0`, pidB).Scan(&waiting)
		return waiting, err
	})

	// The lock goes; A's completion finishes.
	if err := lockTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	gotA := <-doneA
	if !bDone {
		claimedB = <-doneB
	}
	deadlocked := defectSQLState(gotA.err) == "40P01" || defectSQLState(claimedB.err) == "40P01"
	if deadlocked {
		t.Errorf("the completion and the takeover deadlocked: completion %v, claim %v", gotA.err, claimedB.err)
	} else if gotA.err != nil || claimedB.err != nil {
		t.Fatalf("worker A's completion: %v; worker B's claim: %v", gotA.err, claimedB.err)
	}
	takenOver := map[uuid.UUID]defectClaimed{}
	for _, c := range claimedB.rows {
		takenOver[c.id] = c
	}
	t.Logf("worker B took over %d of worker A's %d messages", len(takenOver), len(claimedA))

	// Every row of A's completion was written after its lease expired (the
	// lock went after the expiry), and B had taken what it claimed.
	for _, c := range claimedA {
		if got := gotA.status[c.id]; gotA.err == nil && got != "lease_lost" {
			_, b := takenOver[c.id]
			t.Errorf("worker A's completion of %s seq %d (%s): %q, want lease_lost (its lease expired at %s, before the write; taken over by worker B: %v)",
				c.key, c.seq, c.id, got, c.expires.Format(time.RFC3339Nano), b)
		}
	}
	var writtenByA []string
	rows, err := watcher.Query(ctx, `SELECT ordering_key || ' seq ' || sequence_id || ' ' || state FROM outbox.attempts
		WHERE worker_id = 'worker-A' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	if writtenByA, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(writtenByA) > 0 {
		t.Errorf("worker A recorded outcomes without a live lease: %s", strings.Join(writtenByA, ", "))
	}
	// What B claimed is still pending under B's lease.
	for id, c := range takenOver {
		var holder string
		var token uuid.UUID
		err := watcher.QueryRow(ctx, `
			SELECT h.claimed_by, h.lease_token FROM outbox.pending p
			JOIN outbox.pending h ON h.namespace = p.namespace AND h.ordering_key = p.ordering_key AND NOT h.behind
			WHERE p.id = $1`, id).Scan(&holder, &token)
		if errors.Is(err, pgx.ErrNoRows) {
			t.Errorf("%s seq %d, claimed by worker B, left pending while B held its lease", c.key, c.seq)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if holder != "worker-B" || token != c.token {
			t.Errorf("%s seq %d: its key's head is held by %s under %s, want worker-B under %s", c.key, c.seq, holder, token, c.token)
		}
	}
}
