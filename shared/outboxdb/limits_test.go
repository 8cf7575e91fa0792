package outboxdb_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// The Go producer's DefaultLimits are the database's own defaults, and a
// producer that loads the database's limits follows them when an operator
// changes them: a payload the defaults refuse goes through once the
// database allows it.
func TestProducerLimitsAreTheDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	producer := pgtest.Pool(t, db.LoginAs(t, "outbox_producer"))
	loaded, err := outbox.LoadLimits(ctx, producer)
	if err != nil {
		t.Fatal(err)
	}
	if loaded != outbox.DefaultLimits {
		t.Fatalf("a new database's limits %+v, the producer's DefaultLimits %+v: they must be one and the same", loaded, outbox.DefaultLimits)
	}

	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.limits SET max_payload_bytes = 400000`); err != nil {
		t.Fatal(err)
	}
	big := outbox.Message{Namespace: "billing", Topic: "invoice", Payload: json.RawMessage(`["` + strings.Repeat("x", 300_000) + `"]`)}
	if _, err := outbox.Enqueue(ctx, producer, big); !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Fatalf("300 KB with DefaultLimits: %v, want refused before the database", err)
	}
	loaded, err = outbox.LoadLimits(ctx, producer)
	if err != nil || loaded.MaxPayloadBytes != 400000 {
		t.Fatalf("limits after the operator raised them: %+v (%v)", loaded, err)
	}
	if _, err := (outbox.Producer{Limits: loaded}).Enqueue(ctx, producer, big); err != nil {
		t.Fatalf("300 KB with the database's limits: %v", err)
	}
}
