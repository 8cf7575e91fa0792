package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/google/uuid"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// outboxSchemaExists reports whether schema outbox is still there.
func outboxSchemaExists(t *testing.T, d *pgtest.DB) bool {
	t.Helper()
	return countRows(t, d.Pool, `SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'`) == 1
}

// allApplied fails the test unless migrate status lists every migration as
// applied: nothing was rolled back.
func allApplied(t *testing.T, env invocation, after string) {
	t.Helper()
	r := cli(t, env, "migrate", "status")
	r.wantOK(t, "migrate status after "+after, "applied  00001")
	if strings.Contains(r.out, "pending") {
		t.Errorf("after %s, migrations were rolled back:\n%s", after, r.out)
	}
}

// migrate down drops schema outbox (at --to 0) with every message in it, so
// while messages wait it wants --yes, as replay does.
func TestMigrateDownRefusesWhileTheOutboxHoldsMessages(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	for i := range 3 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	deadLetters(t, d, 1)
	attempts := countRows(t, d.Pool, `SELECT count(*) FROM outbox.attempts`)
	if attempts == 0 {
		t.Fatal("a dead letter without an archived attempt: the test needs one")
	}
	counts := []string{"2 pending messages", "1 dead letter", fmt.Sprintf("%d archived attempt", attempts)}

	for _, args := range [][]string{{"migrate", "down", "--to", "0"}, {"migrate", "down"}} {
		name := strings.Join(args, " ")
		r := cli(t, env, args...)
		r.wantError(t, name, 2, "pass --yes")
		for _, want := range append(counts, "would roll back") {
			if !strings.Contains(r.out, want) {
				t.Errorf("%s: the refusal does not say %q:\n%s", name, want, r.out)
			}
		}
		allApplied(t, env, "a refused "+name)
		if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending`); n != 2 {
			t.Fatalf("after a refused %s, %d pending messages, want 2", name, n)
		}
	}
	r := cli(t, env, "migrate", "down", "--to", "0")
	if !strings.Contains(r.out, "00001_baseline.sql") {
		t.Errorf("migrate down --to 0: the refusal does not list 00001_baseline.sql among the migrations it would roll back:\n%s", r.out)
	}

	cli(t, env, "migrate", "down", "--to", "0", "--yes").
		wantOK(t, "migrate down --to 0 --yes", "rolled back 00001_baseline.sql")
	if outboxSchemaExists(t, d) {
		t.Error("schema outbox survived migrate down --to 0 --yes")
	}
}

// Dead letters alone are messages too.
func TestMigrateDownRefusesWhileDeadLettersWait(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	for i := range 2 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	deadLetters(t, d, 2)
	r := cli(t, env, "migrate", "down")
	r.wantError(t, "migrate down", 2, "pass --yes")
	if !strings.Contains(r.out, "0 pending messages") || !strings.Contains(r.out, "2 dead letters") {
		t.Errorf("migrate down: the refusal does not count the dead letters:\n%s", r.out)
	}
	allApplied(t, env, "a refused migrate down")
}

func TestMigrateDownOfAnEmptyOutboxNeedsNoConfirmation(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	cli(t, env, "migrate", "down", "--to", "0").wantOK(t, "migrate down --to 0", "rolled back 00001_baseline.sql")
	if outboxSchemaExists(t, d) {
		t.Error("schema outbox survived migrate down --to 0")
	}
	// Without schema outbox there is nothing to count, nor to roll back.
	cli(t, env, "migrate", "down", "--to", "0").wantOK(t, "migrate down --to 0, again", "nothing to roll back")
	cli(t, env, "migrate", "down").wantOK(t, "migrate down, with nothing applied", "nothing to roll back")
}

// A pause in force holds messages back, and a confinement keeps a producer
// out of other teams' namespaces: a rollback that would drop them, with no
// message in the outbox, is refused all the same and names them.
func TestMigrateDownRefusesWhilePausesOrConfinementsHold(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	ctx := context.Background()
	if _, err := d.Pool.Exec(ctx, `SELECT outbox.pause('shop', 'refunds.B', 'ana', 'refund backlog on hold')`); err != nil {
		t.Fatal(err)
	}
	r := cli(t, env, "migrate", "down", "--to", "0")
	r.wantError(t, "migrate down --to 0 with a pause in force", 2, "pass --yes")
	for _, want := range []string{"1 pause in force", "shop/refunds.B", "00001_baseline.sql"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, r.out)
		}
	}
	allApplied(t, env, "a refused migrate down with a pause in force")

	if _, err := d.Pool.Exec(ctx, `SELECT outbox.resume('shop', 'refunds.B', 'ana', 'done')`); err != nil {
		t.Fatal(err)
	}
	producerURL := d.LoginAs(t, "outbox_producer") // a role of its own, dropped with the test
	role := strings.SplitN(strings.TrimPrefix(producerURL, "postgres://"), "@", 2)[0]
	if _, err := d.Pool.Exec(ctx, `SELECT outbox.grant_namespace($1, 'reporting', 'ana', 'onboarding')`, role); err != nil {
		t.Fatal(err)
	}
	r = cli(t, env, "migrate", "down", "--to", "0")
	r.wantError(t, "migrate down --to 0 with a confined producer", 2, "1 confined producer role")
	allApplied(t, env, "a refused migrate down with a confined producer")
}

// migrate status --check is a deploy pipeline's gate: exit 3 while
// migrations are pending, 0 once applied; --json says the same to a
// program.
func TestMigrateStatusCheckAndJSON(t *testing.T) {
	t.Parallel()
	env := db(pgtest.NewEmpty(t))
	statusDoc := func(after string) migrationStatus {
		t.Helper()
		r := cli(t, env, "migrate", "status", "--json")
		var doc migrationStatus
		if r.err != nil || json.Unmarshal([]byte(r.out), &doc) != nil {
			t.Fatalf("migrate status --json %s: %v\n%s", after, r.err, r.out)
		}
		return doc
	}

	r := cli(t, env, "migrate", "status", "--check")
	r.wantError(t, "migrate status --check before migrate up", 3, "pending (database at version 0")
	if !strings.Contains(r.out, "pending  00001") {
		t.Errorf("migrate status --check does not list the migrations:\n%s", r.out)
	}
	doc := statusDoc("before migrate up")
	if doc.UpToDate || doc.AppliedVersion != 0 || doc.Pending != len(doc.Migrations)+len(doc.Functions) || len(doc.Functions) == 0 || doc.LatestVersion != doc.Migrations[len(doc.Migrations)-1].Version {
		t.Errorf("migrate status --json before migrate up: %+v", doc)
	}
	cli(t, env, "migrate", "status", "--json", "--check").wantError(t, "migrate status --json --check", 3, "run `outboxctl migrate up`")

	cli(t, env, "migrate", "up").wantOK(t, "migrate up")
	cli(t, env, "migrate", "status", "--check").wantOK(t, "migrate status --check after migrate up", "applied  00001")
	doc = statusDoc("after migrate up")
	if !doc.UpToDate || doc.Pending != 0 || doc.AppliedVersion != doc.LatestVersion {
		t.Errorf("migrate status --json after migrate up: %+v", doc)
	}

	cli(t, env, "migrate", "down").wantOK(t, "migrate down")
	cli(t, env, "migrate", "status", "--check").wantError(t, "migrate status --check after migrate down", 3, "1 migration and ")
}

// migrate connects as the functions do: here with the database's Secrets
// Manager secret (against moto_server), as from a bastion or a CI runner in
// the VPC that has no database URL, only the function's settings.
func TestMigrateWithTheFunctionsDatabaseSettings(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "outboxctl migrate with a Secrets Manager secret")
	bin := buildOutboxctl(t)
	dbURL := pgtest.NewEmpty(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	secret, _ := json.Marshal(map[string]any{"engine": "postgres", "username": u.User.Username(), "password": "trust-auth-ignores-it",
		"host": u.Hostname(), "port": port, "dbname": strings.TrimPrefix(u.Path, "/")})
	out, err := secretsmanager.NewFromConfig(srv.Config()).CreateSecret(context.Background(), &secretsmanager.CreateSecretInput{
		Name: aws.String("outbox-db-" + uuid.NewString()[:8]), SecretString: aws.String(string(secret))})
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = processEnv("OUTBOX_DB_SECRET_ARN="+aws.ToString(out.ARN), "OUTBOX_DB_SSLMODE=disable",
			"AWS_ENDPOINT_URL="+srv.URL, "AWS_REGION="+moto.Region, "AWS_ACCESS_KEY_ID=testing", "AWS_SECRET_ACCESS_KEY=testing")
		b, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(b), exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(b), 0
	}
	if got, code := run("migrate", "status", "--check"); code != 3 {
		t.Fatalf("migrate status --check on an empty database: exit %d\n%s", code, got)
	}
	if got, code := run("migrate", "up"); code != 0 || !strings.Contains(got, "applied 00001_baseline.sql") {
		t.Fatalf("migrate up with OUTBOX_DB_SECRET_ARN: exit %d\n%s", code, got)
	}
	if got, code := run("migrate", "status", "--check"); code != 0 {
		t.Fatalf("migrate status --check after migrate up: exit %d\n%s", code, got)
	}
	// The rollback's safety count runs on the same connection settings.
	pool := pgtest.Connect(t, dbURL)
	if _, err := pool.Exec(context.Background(), `SELECT outbox.enqueue('billing', 'usage', '{}'::jsonb)`); err != nil {
		t.Fatal(err)
	}
	if got, code := run("migrate", "down"); code != 2 || !strings.Contains(got, "1 pending message") {
		t.Fatalf("migrate down with a message waiting: exit %d, want 2 and the count\n%s", code, got)
	}
}
