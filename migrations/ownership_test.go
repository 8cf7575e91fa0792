package migrations_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// A producer confined to its namespaces works in them as before, the
// unconfined owner of another namespace is unaffected, and revoking its
// last namespace leaves it confined to none. What a confined producer is refused (enqueueing into,
// squatting the dedupe keys of or blocking the ordering keys of another
// namespace) is in the privilege matrix: TestEveryMisuseOfAGrantedFunctionIsRefused.
func TestProducerConfinedToItsNamespaces(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	confined := pgtest.Connect(t, db.LoginAs(t, "outbox_producer"))
	var login string
	if err := confined.QueryRow(ctx, `SELECT current_user`).Scan(&login); err != nil {
		t.Fatal(err)
	}
	operator := pgtest.Connect(t, db.LoginAs(t, "outbox_operator"))
	if _, err := operator.Exec(ctx, `SELECT outbox.grant_namespace($1, 'reporting')`, login); err != nil {
		t.Fatalf("an operator grants a namespace: %v", err)
	}
	if _, err := confined.Exec(ctx, `SELECT * FROM outbox.enqueue('payments', 'captured', '{"x": 1}')`); sqlstate(err) != insufficientPrivilege {
		t.Fatalf("confined, into another namespace: %v, want refused", err)
	}
	if _, err := confined.Exec(ctx, `SELECT * FROM outbox.enqueue('reporting', 'daily', '{"rows": 3}', p_dedupe_key => 'pay-77')`); err != nil {
		t.Fatalf("enqueue into its own namespace: %v", err)
	}

	// The payments team's own producer (not confined) is unaffected.
	payments := lease.NewStore(db.Pool)
	res, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "payments", Topic: "captured", DedupeKey: "pay-77",
		OrderingKey: "acct-9", Payload: json.RawMessage(`{"amount": 12}`)})
	if err != nil || !res.Inserted || res.SequenceID != 1 {
		t.Fatalf("the owner of the namespace: %+v %v, want its own message, first of its key", res, err)
	}
	claimed, err := payments.ClaimBatch(ctx, lease.ClaimParams{WorkerID: "w", BatchSize: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var pay int
	for _, m := range claimed {
		if m.Namespace == "payments" {
			pay++
			if string(m.Payload) != `{"amount": 12}` {
				t.Errorf("payments delivers %s", m.Payload)
			}
		}
	}
	if pay != 1 {
		t.Fatalf("%d payments messages claimable, want its own one", pay)
	}

	// Its last namespace revoked, the login is confined to none: revoking
	// access must never grant more. Lifting the confinement, with a reason,
	// is an act of its own.
	if _, err := operator.Exec(ctx, `SELECT outbox.revoke_namespace($1, 'reporting')`, login); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"payments", "reporting"} {
		_, err := confined.Exec(ctx, `SELECT * FROM outbox.enqueue($1, 'refunded', '{"x": 1}')`, ns)
		if sqlstate(err) != insufficientPrivilege || !strings.Contains(err.Error(), "may not enqueue into namespace") {
			t.Fatalf("after its last namespace was revoked, into %s: %v, want refused (42501)", ns, err)
		}
	}
	if _, err := operator.Exec(ctx, `SELECT outbox.unconfine_producer($1, 'ana', 'reporting retired')`, login); err != nil {
		t.Fatal(err)
	}
	if _, err := confined.Exec(ctx, `SELECT * FROM outbox.enqueue('payments', 'refunded', '{"x": 1}')`); err != nil {
		t.Fatalf("after the confinement was lifted: %v", err)
	}
	var logged int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox.operator_log WHERE action = 'unconfine_producer' AND subject = $1
		AND operator = 'ana' AND details->'namespaces' = '[]'`, login).Scan(&logged); err != nil || logged != 1 {
		t.Fatalf("operator_log rows for the lifted confinement: %d (%v), want 1", logged, err)
	}
}

// The schema and its functions belong to outbox_owner, not to the
// superuser that migrated. (That a function the owner creates later is
// executable by no one until granted is in the privilege matrix:
// TestEveryForbiddenActIsDenied.)
func TestSchemaBelongsToTheOutboxOwner(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	var notOwned int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'outbox' AND p.proowner <> 'outbox_owner'::regrole`).Scan(&notOwned); err != nil || notOwned != 0 {
		t.Fatalf("%d outbox functions not owned by outbox_owner (%v)", notOwned, err)
	}
	var super bool
	if err := db.Pool.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = 'outbox_owner'`).Scan(&super); err != nil || super {
		t.Fatalf("outbox_owner is a superuser (%v)", err)
	}
}
