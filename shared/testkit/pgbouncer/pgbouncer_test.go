package pgbouncer_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/testkit/pgbouncer"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// A client reaches the test's database through the bouncer, which keeps
// PgBouncer's default refusal of unknown startup parameters.
func TestStartPutsPgBouncerInFrontOfTheTestServer(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b := pgbouncer.Start(t)
	ctx := context.Background()

	cfg, err := pgx.ParseConfig(b.URL(t, db.URL))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through PgBouncer: %v\n%s", err, b.Output())
	}
	defer conn.Close(ctx)
	var name string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil || name != db.Name {
		t.Errorf("through PgBouncer: database %q, %v; want %q", name, err, db.Name)
	}

	cfg.RuntimeParams["statement_timeout"] = "1000"
	if c, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		c.Close(ctx)
		t.Error("PgBouncer accepted statement_timeout as a startup parameter: not its default configuration")
	} else if !strings.Contains(err.Error(), "unsupported startup parameter") {
		t.Errorf("startup parameter refused with %v, want PgBouncer's unsupported startup parameter", err)
	}
}
