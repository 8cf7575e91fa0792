package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/localpg"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	moto.Stop()
	removeBuiltOutboxctl()
	os.Exit(code)
}

// demoDatabase is a database name of its own for one demo run on the test
// server, dropped when the test ends.
func demoDatabase(t *testing.T) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "outbox_t_demo_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, pgtest.URL())
		if err != nil {
			t.Logf("drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Logf("drop %s: %v", name, err)
		}
	})
	return name
}

func runDemoJSON(t *testing.T, inv invocation, args ...string) demoReport {
	t.Helper()
	r := cli(t, inv, append([]string{"demo", "--json"}, args...)...)
	if r.err != nil {
		t.Fatalf("demo: %v\n%s", r.err, r.out)
	}
	var rep demoReport
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("demo --json: %v\n%s", err, r.out)
	}
	return rep
}

// checkReport holds a demo's summary to its promises: every message but the
// poison delivered, and handled by the sink exactly once; the poison dead
// and listed by the replay dry run; nothing left pending.
func checkReport(t *testing.T, rep demoReport, messages int) {
	t.Helper()
	http := rep.DeliveredByTarget["http"]
	if rep.Poison != poisonCount || rep.Enqueued < messages || http != messages-poisonCount {
		t.Errorf("enqueued %d (%d poison), %d delivered over http; want %d snapshots, %d of them poison", rep.Enqueued, rep.Poison, http, messages, poisonCount)
	}
	if rep.Delivered != rep.Enqueued-rep.Poison || rep.Dead != rep.Poison || rep.PendingAfterDrain != 0 {
		t.Errorf("delivered %d, dead %d, pending %d of %d enqueued", rep.Delivered, rep.Dead, rep.PendingAfterDrain, rep.Enqueued)
	}
	if rep.SinkHandledKeys != http || rep.SinkMissingKeys != 0 || rep.Sink.MaxHandledPerKey != 1 {
		t.Errorf("the sink handled %d keys (%d missing, at most %d times each), want %d exactly once", rep.SinkHandledKeys, rep.SinkMissingKeys, rep.Sink.MaxHandledPerKey, http)
	}
	if rep.EnqueueDedupe != messages/everyRepeated {
		t.Errorf("%d duplicates suppressed at enqueue, want %d", rep.EnqueueDedupe, messages/everyRepeated)
	}
	if rep.Sink.Duplicates != rep.Sink.LostAcks || rep.Sink.OrderViolations != 0 || rep.Retried < rep.Sink.LostAcks {
		t.Errorf("sink %+v, %d retried: every lost answer should come back once as a duplicate, in order", rep.Sink, rep.Retried)
	}
	if rep.ReplayDry.Matched != rep.Poison || !rep.ReplayDry.DryRun || rep.ReplayDry.Replayed != 0 ||
		!slices.Equal(rep.ReplayDry.MessageIDs, rep.DeadLetters) {
		t.Errorf("replay dry run %+v, dead letters %v: want the poison listed, nothing moved", rep.ReplayDry, rep.DeadLetters)
	}
	if rep.Reaper.Requeued != 0 || rep.ThroughputPerSec <= 0 || rep.LatencyP99Millis < rep.LatencyP50Millis {
		t.Errorf("reaper %+v, throughput %.0f/s, latency p50 %.1fms p99 %.1fms", rep.Reaper, rep.ThroughputPerSec, rep.LatencyP50Millis, rep.LatencyP99Millis)
	}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	name := demoDatabase(t)
	local := t.TempDir()
	env := invocation{env: map[string]string{"OUTBOX_DATABASE_URL": pgtest.URL()}}

	// What a newcomer reads.
	text := cli(t, env, "demo", "--demo-database", name, "--messages", "300", "--tenants", "7", "--local-dir", local)
	text.wantOK(t, "demo", "1. PostgreSQL", "the server of OUTBOX_DATABASE_URL", "fresh database "+name,
		"2. Migrations", fmt.Sprintf("%d applied", embeddedMigrations(t)), "3. Enqueue", "300 usage snapshots for 7 tenants", "6 suppressed",
		"4. Sink", "5. Dispatch", "[██████████████████████████████] 300/300", "6. Reaper", `{"requeued":0,"purged_attempts":0,"purged_dedupe":0,"purged_keys":0}`,
		"7. Dead letters", "$ outboxctl dead list", "TARGET_REJECTED", "8. Replay", "dry run: 5 dead letters would be replayed",
		"Summary", "delivered              295: 295 http", "exactly once           the sink handled 295 keys, each once (0 missing;",
		"dead                   5", "latency p50 / p99", "export OUTBOX_DATABASE_URL=")
	runExploreLines(t, text.out)

	// Again, larger, on the database it leaves behind: dropped and made
	// afresh.
	rep := runDemoJSON(t, env, "--demo-database", name, "--messages", "3000", "--tenants", "20", "--local-dir", local)
	checkReport(t, rep, 3000)
	if !strings.Contains(rep.Postgres, "OUTBOX_DATABASE_URL") || rep.Migrations != embeddedMigrations(t) {
		t.Errorf("postgres %q, %d migrations", rep.Postgres, rep.Migrations)
	}
	dbURL, err := withDatabase(pgtest.URL(), name)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if n := countRows(t, pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`); n != rep.Delivered {
		t.Errorf("%d deliveries recorded, the summary says %d", n, rep.Delivered)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM outbox.dead WHERE last_error_code = 'TARGET_REJECTED'`); n != poisonCount {
		t.Errorf("%d dead letters, want the %d poison messages", n, poisonCount)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM outbox_sink_dedupe`); n != rep.SinkHandledKeys {
		t.Errorf("%d webhook-ids in the sink's table, %d keys handled", n, rep.SinkHandledKeys)
	}
	if info, err := os.Stat(filepath.Join(local, "demo.log")); err != nil || info.Size() == 0 {
		t.Errorf("no handler logs in demo.log: %v", err)
	}
}

func TestDemoBadInput(t *testing.T) {
	t.Parallel()
	env := invocation{env: map[string]string{"OUTBOX_DATABASE_URL": pgtest.URL()}}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--messages", "5"}, "--messages must be between 10 and 1000000"},
		{[]string{"--tenants", "0"}, "--tenants must be between 1 and 10000"},
		{[]string{"--postgres", "docker"}, `--postgres must be auto or throwaway, got "docker"`},
		{[]string{"--demo-database", "Robert'); DROP TABLE students;--"}, "--demo-database must be a plain lower-case database name"},
		{[]string{"--demo-database", "test"}, `refusing to drop database "test", which OUTBOX_DATABASE_URL names`},
		{[]string{"--timeout", "0s"}, "--timeout must be positive"},
		{[]string{"--mesages", "5"}, "unknown flag: --mesages"},
	} {
		cli(t, env, append([]string{"demo"}, tc.args...)...).wantError(t, strings.Join(tc.args, " "), 2, tc.want)
	}
}

// TestDemoOnAThrowawayCluster runs the demo with no server configured and
// --postgres throwaway: it starts a cluster from the machine's binaries,
// runs the whole path on it, and stops it.
func TestDemoOnAThrowawayCluster(t *testing.T) {
	t.Parallel()
	if _, err := localpg.FindBinaries(); err != nil {
		t.Skipf("no PostgreSQL binaries on this machine: %v", err)
	}
	// Under root the cluster runs as the postgres user, who must reach it:
	// not t.TempDir, which is private.
	local, err := os.MkdirTemp("", "outboxctl-demo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(local) })
	if err := os.Chmod(local, 0o755); err != nil {
		t.Fatal(err)
	}
	rep := runDemoJSON(t, invocation{}, "--postgres", "throwaway", "--local-dir", local, "--messages", "500")
	checkReport(t, rep, 500)
	if !strings.Contains(rep.Postgres, "throwaway PostgreSQL") {
		t.Errorf("ran on %q", rep.Postgres)
	}
	if _, err := os.Stat(filepath.Join(local, "pg", "data", "postmaster.pid")); !os.IsNotExist(err) {
		t.Errorf("the throwaway cluster still runs after the demo (postmaster.pid: %v)", err)
	}
}

// TestDemoWithAnAWSEmulator adds the SNS and EventBridge routes when
// AWS_ENDPOINT_URL points at an emulator. It sets the process environment
// (the AWS SDK reads it), so it does not run in parallel.
func TestDemoWithAnAWSEmulator(t *testing.T) {
	srv := moto.Start(t, "the demo's SNS and EventBridge routes")
	t.Setenv("AWS_ENDPOINT_URL", srv.URL)
	t.Setenv("AWS_REGION", moto.Region)
	t.Setenv("AWS_ACCESS_KEY_ID", "testing")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "testing")
	name := demoDatabase(t)
	rep := runDemoJSON(t, invocation{env: map[string]string{"OUTBOX_DATABASE_URL": pgtest.URL()}},
		"--demo-database", name, "--messages", "300", "--local-dir", t.TempDir())
	checkReport(t, rep, 300)
	if rep.DeliveredByTarget["sns"] != awsMessages || rep.DeliveredByTarget["eventbridge"] != awsMessages {
		t.Errorf("delivered by target %v, want %d to sns and to eventbridge", rep.DeliveredByTarget, awsMessages)
	}
	if !strings.Contains(rep.AWS, "SNS topic arn:aws:sns:") || !strings.Contains(rep.AWS, srv.URL) {
		t.Errorf("aws: %q", rep.AWS)
	}
}

// embeddedMigrations counts the migration files every binary carries.
func embeddedMigrations(t *testing.T) int {
	t.Helper()
	files, err := fs.Glob(migrations.FS(), "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	return len(files)
}

// runExploreLines runs the commands the demo's summary prints, as printed:
// the export sets the database, and every bin/outboxctl line must parse
// and succeed on it.
func runExploreLines(t *testing.T, out string) {
	t.Helper()
	_, explore, ok := strings.Cut(out, "Explore the result")
	if !ok {
		t.Fatalf("the demo prints no commands to explore the result:\n%s", out)
	}
	lines := strings.Split(explore, "\n")[1:]
	env := map[string]string{"OUTBOX_TRACING": "off"}
	var commands int
	for _, line := range lines {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "export OUTBOX_DATABASE_URL="):
			env["OUTBOX_DATABASE_URL"] = strings.Trim(strings.TrimPrefix(line, "export OUTBOX_DATABASE_URL="), "'")
		case strings.HasPrefix(line, "bin/outboxctl "):
			if env["OUTBOX_DATABASE_URL"] == "" {
				t.Fatalf("%q comes before the export of OUTBOX_DATABASE_URL", line)
			}
			if strings.ContainsAny(line, "<>|;$") {
				t.Errorf("%q is not a command to run as printed", line)
				continue
			}
			commands++
			cli(t, invocation{env: env}, strings.Fields(line)[1:]...).wantOK(t, line)
		case line == "":
		default:
			t.Errorf("the explore lines hold %q, neither an export nor a bin/outboxctl command", line)
		}
		if line == "" {
			break
		}
	}
	if commands < 3 {
		t.Errorf("%d commands to explore the result, want status, dead list, dead show and replay", commands)
	}
	// bin/outboxctl is what make outboxctl (and make run) build.
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "-o bin/outboxctl ./cmd/outboxctl") {
		t.Error("the Makefile does not build bin/outboxctl, which the demo's explore lines run")
	}
}
