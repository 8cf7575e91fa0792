package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// The binary says which commit it was built from, so that an operator can
// tell which outboxctl produced a report.
func TestVersionNamesTheRevision(t *testing.T) {
	t.Parallel()
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout (git rev-parse HEAD: %v): the VCS revision cannot be stamped nor checked", err)
	}
	bin := filepath.Join(t.TempDir(), "outboxctl")
	// -buildvcs=true overrides a GOFLAGS=-buildvcs=false, as a release
	// build would.
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildvcs=true", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	outputOf := func(args ...string) string {
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			t.Fatalf("outboxctl %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	// What the toolchain recorded in the binary is the truth outboxctl
	// must tell. Go does not stamp a git worktree's checkout (its .git is
	// a file), so a build there has no revision, and must claim none.
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var stamped string
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			stamped = s.Value
		}
	}
	revision := strings.TrimSpace(string(head))
	version := info.Main.Version
	line := outputOf("version")
	switch {
	case stamped == "":
		t.Logf("the toolchain stamped no VCS revision here (a git worktree?): checking that none is claimed")
		if want := "outboxctl " + version + ", " + runtime.Version() + "\n"; line != want {
			t.Errorf("outboxctl version = %q, want %q", line, want)
		}
		revision = ""
	case stamped != revision:
		t.Fatalf("the binary was stamped with %s, git says HEAD is %s", stamped, revision)
	case !strings.HasPrefix(line, "outboxctl "+version+" revision "+revision) || !strings.Contains(line, runtime.Version()):
		t.Errorf("outboxctl version = %q, want the module version %s, revision %s and %s", line, version, revision, runtime.Version())
	}
	if flag := outputOf("--version"); flag != line {
		t.Errorf("outboxctl --version = %q, outboxctl version = %q: want the same line", flag, line)
	}
	var v buildVersion
	if err := json.Unmarshal([]byte(outputOf("version", "--json")), &v); err != nil || v.Revision != revision || v.Module != "github.com/outboxkit/dispatcher" {
		t.Errorf("outboxctl version --json: %+v (%v), want revision %s of github.com/outboxkit/dispatcher", v, err, revision)
	}
}

// A mistyped command or subcommand is answered with the nearest names,
// a swap of two letters counting as one mistake.
func TestMistypedCommandsAreSuggested(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stauts"}, `unknown command "stauts": did you mean status?`},
		{[]string{"mgirate", "up"}, `unknown command "mgirate": did you mean migrate?`},
		{[]string{"replya"}, `unknown command "replya": did you mean replay?`},
		{[]string{"dea"}, `unknown command "dea": did you mean dead?`},
		{[]string{"migrate", "stauts"}, `unknown migrate subcommand "stauts": did you mean status?`},
		{[]string{"migrate", "upp"}, `unknown migrate subcommand "upp": did you mean up?`},
		{[]string{"dead", "lsit"}, `unknown dead subcommand "lsit": did you mean list?`},
		{[]string{"dead", "shwo", "x"}, `unknown dead subcommand "shwo": did you mean show?`},
		{[]string{"completion", "bsah"}, `unknown completion subcommand "bsah": did you mean bash?`},
		{[]string{"invoke", "metrcis"}, `unknown function "metrcis": did you mean metrics?`},
		{[]string{"invoke", "reeper"}, `unknown function "reeper": did you mean reaper?`},
		// Nothing near: the list to choose from.
		{[]string{"frobnicate"}, `unknown command "frobnicate": see outboxctl --help`},
		{[]string{"migrate", "sideways"}, `unknown migrate subcommand "sideways": use down, status or up`},
		{[]string{"dead", "bury"}, `unknown dead subcommand "bury": use list, purge or show`},
		{[]string{"pending", "lst"}, `unknown pending subcommand "lst": did you mean list?`},
	} {
		cli(t, invocation{}, tc.args...).wantError(t, strings.Join(tc.args, " "), 2, tc.want)
	}
}

func TestEditDistance(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"status", "status", 0}, {"stauts", "status", 1}, {"sttus", "status", 1},
		{"statuss", "status", 1}, {"statsu", "status", 1}, {"", "up", 2}, {"dead", "demo", 2},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// Every usage error exits 2, whichever part of the command line is wrong
// and whichever validator noticed, so that a script can tell "called
// wrongly" from "failed".
func TestEveryUsageErrorExitsTwo(t *testing.T) {
	t.Parallel()
	noDB := invocation{env: map[string]string{"OUTBOX_DATABASE_URL": ""}}
	// Nothing listens there: a command that got past its usage checks
	// would fail with 1, not 2.
	nowhere := db("postgres://nobody@127.0.0.1:1/x?connect_timeout=2")
	for _, tc := range []struct {
		inv  invocation
		args []string
	}{
		{nowhere, []string{"--frobnicate"}},
		{nowhere, []string{"stats"}},
		{nowhere, []string{"migrate"}},
		{nowhere, []string{"migrate", "up", "extra"}},
		{nowhere, []string{"migrate", "status", "extra"}},
		{nowhere, []string{"migrate", "status", "--chek"}},
		{nowhere, []string{"migrate", "down", "--to", "-1"}},
		{noDB, []string{"migrate", "up"}},
		{noDB, []string{"status"}},
		{nowhere, []string{"status", "extra", "more"}},
		{nowhere, []string{"status", "--watch", "1ms"}},
		{nowhere, []string{"dead"}},
		{nowhere, []string{"dead", "show"}},
		{nowhere, []string{"dead", "show", "a", "b"}},
		{nowhere, []string{"dead", "list", "--error-code", "NOPE"}},
		{nowhere, []string{"dead", "list", "--limit", "lots"}},
		{nowhere, []string{"replay"}},
		{nowhere, []string{"replay", "--error-code", "no_route"}},
		{nowhere, []string{"discard"}},
		{nowhere, []string{"discard", "not-a-uuid"}},
		{nowhere, []string{"blocked", "extra"}},
		{nowhere, []string{"enqueue", "--namespace"}},
		{nowhere, []string{"invoke"}},
		{nowhere, []string{"invoke", "dispatch", "extra"}},
		{nowhere, []string{"invoke", "reaper", "--event", "/no/such/event.json"}},
		{nowhere, []string{"serve", "extra"}},
		{nowhere, []string{"sink", "extra"}},
		{nowhere, []string{"demo", "extra"}},
		{nowhere, []string{"version", "extra"}},
		{nowhere, []string{"completion"}},
		{nowhere, []string{"completion", "fish", "extra"}},
	} {
		name := strings.Join(tc.args, " ")
		r := cli(t, tc.inv, tc.args...)
		if r.err == nil || r.code != 2 {
			t.Errorf("outboxctl %s: exit %d (%v), want 2 for a usage error", name, r.code, r.err)
		}
	}
}

// A configuration with several problems shows each on its own line, as
// main prints it, so that the fourth is not lost at the end of a long line.
func TestConfigurationProblemsOnePerLine(t *testing.T) {
	t.Parallel()
	bin := buildOutboxctl(t)
	cmd := exec.Command(bin, "invoke", "dispatch")
	cmd.Env = processEnv("OUTBOX_DATABASE_URL=postgres://nobody@127.0.0.1:1/x", "OUTBOX_BATCH_SIZE=0", "OUTBOX_LEASE=soon",
		`OUTBOX_ROUTES={"routes":[{"match":{"namespace":"billing"}}]}`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("invoke dispatch with a bad configuration: %v, want exit 1\n%s", err, stderr.String())
	}
	want := []string{
		"outboxctl: dispatch: cold start failed: OUTBOX_BATCH_SIZE must be between 1 and 10000, got 0",
		`  OUTBOX_LEASE must be a Go duration such as 30s or 15m, got "soon"`,
		"  route: invalid configuration in OUTBOX_ROUTES (2 problems):",
		"    routes[0].match.topic: is required",
		"    routes[0].target: is required",
	}
	if got := strings.Split(strings.TrimSpace(stderr.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("stderr:\n%s\nwant:\n%s", stderr.String(), strings.Join(want, "\n"))
	}
}

// A reachable database without the outbox schema tells the operator what
// to run, whichever command met it.
func TestUnmigratedDatabaseSaysMigrateUp(t *testing.T) {
	t.Parallel()
	env := db(pgtest.NewEmpty(t))
	for _, args := range [][]string{
		{"status"},
		{"dead", "list"},
		{"blocked"},
		{"replay", "--all"},
		{"invoke", "reaper"},
	} {
		cli(t, env, args...).wantError(t, strings.Join(args, " "), 1, "run `outboxctl migrate up`")
	}
	cli(t, env, "migrate", "up").wantOK(t, "migrate up", "applied 00001_baseline.sql")
	cli(t, env, "status").wantOK(t, "status after migrate up", "the outbox is empty")
}

// A database that does not answer is one error naming the server (never
// its password), not pgx's one per address and TLS mode tried.
func TestUnreachableDatabaseIsOneError(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	env := db("postgres://nobody:hunter2@" + addr + "/app?connect_timeout=5")
	want := fmt.Sprintf("cannot reach PostgreSQL at nobody@%s/app (connection refused): is the server running", addr)
	for _, args := range [][]string{{"status"}, {"dead", "list"}, {"migrate", "up"}, {"migrate", "status"}, {"invoke", "reaper"}} {
		name := strings.Join(args, " ")
		r := cli(t, env, args...)
		r.wantError(t, name, 1, want)
		if r.err == nil {
			continue
		}
		msg := oneLine(r.err)
		if strings.Contains(msg, "hunter2") {
			t.Errorf("%s: the error shows the password: %s", name, msg)
		}
		if n := strings.Count(msg, addr); n != 1 {
			t.Errorf("%s: the error names %s %d times, want once: %s", name, addr, n, msg)
		}
	}
}

// An --error-code no dispatcher records would match nothing, and a dry run
// would report nothing to replay while the letters wait: refused, with the
// codes.
func TestUnknownErrorCodeIsRefusedWithTheCodes(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := db(d.URL)
	for _, args := range [][]string{
		{"dead", "list", "--error-code", "NO_ROUTES"},
		{"replay", "--error-code", "no_route"},
	} {
		r := cli(t, env, args...)
		r.wantError(t, strings.Join(args, " "), 2, "did you mean NO_ROUTE?")
		for _, c := range outboxtype.Codes {
			if r.err != nil && !strings.Contains(r.err.Error(), string(c)) {
				t.Errorf("%v: the refusal does not list %s: %v", args, c, r.err)
			}
		}
	}
	cli(t, env, "dead", "list", "--error-code", "BOGUS").wantError(t, "dead list --error-code BOGUS", 2,
		`--error-code "BOGUS" is not an error code: use one of THROTTLED, TIMEOUT`)
	cli(t, env, "dead", "list", "--error-code", "TARGET_REJECTED").wantOK(t, "a known code", "no dead letters match")
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

// A routes file that covers only some of the pending namespaces/topics
// would send the rest through NO_ROUTE: invoke dispatch says so first, and
// the rest are held, not dead-lettered.
func TestInvokeDispatchWarnsOfUnroutedTopics(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	_, url := startSink(t, 0)
	for i := range 3 {
		enqueueMessages(t, d.Pool, usageMessage(i))
	}
	for i := range 2 {
		enqueueMessages(t, d.Pool, outbox.Message{Namespace: "audit", Topic: "login", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	env := db(d.URL, "OUTBOX_ROUTES", routesTo(url), "SINK_SECRET", testSecret, "OUTBOX_LOG_LEVEL", "error")

	r := cli(t, env, "invoke", "dispatch")
	r.wantOK(t, "invoke dispatch", "warning: 2 pending messages in audit/login match no route: dispatch will hold them as NO_ROUTE", `"delivered": 3`)
	if strings.Contains(r.out, "billing/usage_snapshot match no route") {
		t.Errorf("invoke dispatch warns of a routed topic:\n%s", r.out)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending WHERE namespace = 'audit' AND last_error_code = 'NO_ROUTE'`); n != 2 {
		t.Errorf("%d audit messages pending with NO_ROUTE, want both held", n)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.dead`); n != 0 {
		t.Errorf("%d dead letters: NO_ROUTE dead-lettered messages", n)
	}

	// Routes covering everything pending: no warning.
	everything := db(d.URL, "OUTBOX_ROUTES", strings.Replace(routesTo(url), `"namespace":"billing"`, `"namespace":"*"`, 1),
		"SINK_SECRET", testSecret, "OUTBOX_LOG_LEVEL", "error")
	if r := cli(t, everything, "invoke", "dispatch"); strings.Contains(r.out, "warning:") {
		t.Errorf("invoke dispatch with routes for everything warns:\n%s", r.out)
	}
	// A dispatcher confined to billing (OUTBOX_NAMESPACES) never claims
	// audit: nothing to warn of.
	confined := db(d.URL, "OUTBOX_ROUTES", routesTo(url), "SINK_SECRET", testSecret, "OUTBOX_LOG_LEVEL", "error", "OUTBOX_NAMESPACES", "billing")
	enqueueMessages(t, d.Pool, outbox.Message{Namespace: "audit", Topic: "logout", Payload: json.RawMessage(`{}`)})
	if r := cli(t, confined, "invoke", "dispatch"); strings.Contains(r.out, "warning:") {
		t.Errorf("invoke dispatch confined to billing warns of audit:\n%s", r.out)
	}
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

// The migrate function's handler runs in-process as the others do: {}
// applies, the status event lists.
func TestInvokeMigrate(t *testing.T) {
	t.Parallel()
	env := db(pgtest.NewEmpty(t))
	cli(t, env, "invoke", "migrate", "--event", "../../events/migrate-status.json").wantOK(t, "invoke migrate (status)", `"action": "status"`, `"version": 0`)
	r := cli(t, env, "invoke", "migrate")
	r.wantOK(t, "invoke migrate", `"action": "up"`, `"00001_baseline.sql"`, `"pending": 0`)
	cli(t, env, "migrate", "status", "--check").wantOK(t, "migrate status --check after invoke migrate")
	cli(t, env, "invoke", "migrate", "--event", "../../events/migrate-up.json").wantOK(t, "invoke migrate again", `"applied": []`)
	cli(t, invocation{env: env.env, stdin: `{"action":"down"}`}, "invoke", "migrate", "--event", "-").wantError(t, "invoke migrate down", 2, "action must be up or status")
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
