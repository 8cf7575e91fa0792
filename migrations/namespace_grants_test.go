package migrations_test

import (
	"context"
	"testing"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// Defect 4: a producer confined to namespaces stays confined when its last
// grant is revoked: it may then enqueue nowhere, not everywhere.
func TestRevokingTheLastGrantConfinesToNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	producer, login := defectLogin(t, db, "outbox_producer")
	operator, _ := defectLogin(t, db, "outbox_operator")

	if _, err := operator.Exec(ctx, `SELECT outbox.grant_namespace($1, 'reporting', 'ops', 'reports only')`, login); err != nil {
		t.Fatal(err)
	}
	if _, err := producer.Exec(ctx, `SELECT * FROM outbox.enqueue('payments', 'captured', '{"x": 1}')`); defectSQLState(err) != "42501" {
		t.Fatalf("granted reporting only, into payments: %v, want refused with 42501", err)
	}
	if _, err := operator.Exec(ctx, `SELECT outbox.revoke_namespace($1, 'reporting', 'ops', 'reports moved')`, login); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"payments", "reporting"} {
		_, err := producer.Exec(ctx, `SELECT * FROM outbox.enqueue($1, 'captured', '{"x": 1}')`, ns)
		if defectSQLState(err) != "42501" {
			t.Errorf("every grant revoked, into %s: %v, want refused with 42501", ns, err)
		}
	}
}
