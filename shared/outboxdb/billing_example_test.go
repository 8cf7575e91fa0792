package outboxdb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// The billing completeness invariant: a committed quota debit exists if and
// only if its usage message does. A turn is finalised by a compare-and-set;
// only the winner debits and enqueues, in the same transaction.

const billingSchema = `
CREATE TABLE turns (id text PRIMARY KEY, tenant_id text NOT NULL, state text NOT NULL, tokens int NOT NULL);
CREATE TABLE quota (tenant_id text PRIMARY KEY, used_tokens bigint NOT NULL);
INSERT INTO quota VALUES ('tenant-1', 0);
`

var errLostRace = errors.New("turn already finalised")

func finalizeTurn(ctx context.Context, pool *pgxpool.Pool, turnID, requestID string, fail error) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var tenant string
		var tokens int
		err := tx.QueryRow(ctx, `UPDATE turns SET state = 'completed' WHERE id = $1 AND state = 'running' RETURNING tenant_id, tokens`, turnID).Scan(&tenant, &tokens)
		if errors.Is(err, pgx.ErrNoRows) {
			return errLostRace // the CAS loser writes nothing
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE quota SET used_tokens = used_tokens + $2 WHERE tenant_id = $1`, tenant, tokens); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"tenant_id": tenant, "turn_id": turnID, "request_id": requestID, "tokens": tokens, "policy_version_applied": 3})
		if _, err := outbox.Enqueue(ctx, tx, outbox.Message{
			Namespace: "mini-chat", Topic: "usage_snapshot", TenantID: tenant,
			DedupeKey: fmt.Sprintf("%s/%s/%s", tenant, turnID, requestID), Payload: payload,
		}); err != nil {
			return err
		}
		return fail // a failure after the enqueue rolls everything back
	})
}

func TestBillingCompletenessConcurrentFinalizers(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 50 })
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, billingSchema+`INSERT INTO turns VALUES ('turn-1', 'tenant-1', 'running', 1200);`); err != nil {
		t.Fatal(err)
	}

	const finalizers = 50
	var (
		wg            sync.WaitGroup
		start         = make(chan struct{})
		mu            sync.Mutex
		won, lost     int
		unexpectedErr []error
	)
	for i := range finalizers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// Each finalizer has its own request id: only the CAS, not the
			// dedupe key, may keep the losers out.
			err := finalizeTurn(ctx, db.Pool, "turn-1", fmt.Sprintf("req-%d", i), nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, errLostRace):
				lost++
			default:
				unexpectedErr = append(unexpectedErr, err)
			}
		}()
	}
	close(start)
	wg.Wait()

	if len(unexpectedErr) > 0 {
		t.Fatalf("finalizer errors: %v", unexpectedErr)
	}
	if won != 1 || lost != finalizers-1 {
		t.Fatalf("won %d, lost %d; want 1 and %d", won, lost, finalizers-1)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE namespace = 'mini-chat' AND topic = 'usage_snapshot'`); n != 1 {
		t.Fatalf("outbox has %d usage messages, want exactly 1", n)
	}
	if n := count(t, db.Pool, `SELECT used_tokens FROM quota WHERE tenant_id = 'tenant-1'`); n != 1200 {
		t.Fatalf("quota debited %d tokens, want 1200 (one debit)", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending p JOIN turns t ON p.payload->>'turn_id' = t.id WHERE t.state = 'completed'`); n != 1 {
		t.Fatalf("the outbox row does not describe the finalised turn")
	}
}

func TestBillingRollbackLeavesNeitherDebitNorMessage(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, billingSchema+`INSERT INTO turns VALUES ('turn-2', 'tenant-1', 'running', 700);`); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("settlement failed after enqueue")
	if err := finalizeTurn(ctx, db.Pool, "turn-2", "req-1", boom); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the injected failure", err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); n != 0 {
		t.Fatalf("rolled-back finalisation left %d outbox rows", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dedupe`); n != 0 {
		t.Fatalf("rolled-back finalisation left %d dedupe keys", n)
	}
	if n := count(t, db.Pool, `SELECT used_tokens FROM quota`); n != 0 {
		t.Fatalf("rolled-back finalisation debited %d tokens", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM turns WHERE state = 'running'`); n != 1 {
		t.Fatalf("rolled-back finalisation changed the turn")
	}
	// The retry of the same finalisation now succeeds, once.
	if err := finalizeTurn(ctx, db.Pool, "turn-2", "req-1", nil); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.pending`); n != 1 {
		t.Fatalf("after the retry the outbox has %d rows, want 1", n)
	}
}
