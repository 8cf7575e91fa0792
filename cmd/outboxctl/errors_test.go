package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

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

// A mistyped flag is answered with the nearest of the command's flags,
// its own and inherited, as a mistyped command is.
func TestMistypedFlagsAreSuggested(t *testing.T) {
	t.Parallel()
	noDB := invocation{env: map[string]string{"OUTBOX_DATABASE_URL": ""}}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--jsn"}, "unknown flag: --jsn: did you mean --json?"},
		{[]string{"status", "--wacth", "1s"}, "unknown flag: --wacth: did you mean --watch?"},
		{[]string{"dead", "list", "--error-cod", "X"}, "unknown flag: --error-cod: did you mean --error-code?"},
		{[]string{"retry", "--ye"}, "unknown flag: --ye: did you mean --yes?"},
		{[]string{"status", "--databse-url", "x"}, "unknown flag: --databse-url: did you mean --database-url?"},
		{[]string{"status", "--frobnicate"}, "unknown flag: --frobnicate (see outboxctl status --help)"},
	} {
		cli(t, noDB, tc.args...).wantError(t, strings.Join(tc.args, " "), 2, tc.want)
	}
}

// A bad --database-url is the flag's mistake: the error names the flag,
// not OUTBOX_DATABASE_URL, which may not even be set; the variable is
// named when it is the variable that is wrong. A URL of another scheme
// says so.
func TestABadDatabaseURLNamesWhereItCameFrom(t *testing.T) {
	t.Parallel()
	noDB := invocation{env: map[string]string{"OUTBOX_DATABASE_URL": ""}}
	for _, args := range [][]string{{"status"}, {"migrate", "status"}, {"dead", "list"}} {
		name := strings.Join(args, " ")
		r := cli(t, noDB, append(args, "--database-url", "postgress://foo")...)
		r.wantError(t, name+" --database-url postgress://foo", 2, "--database-url: is not a PostgreSQL URL: its scheme is postgress://, want postgres:// or postgresql://")
		if r.err != nil && strings.Contains(r.err.Error(), "OUTBOX_DATABASE_URL") {
			t.Errorf("%s: the error blames OUTBOX_DATABASE_URL, which is not set: %v", name, r.err)
		}
		cli(t, db("postgress://foo"), args...).wantError(t, name+" with OUTBOX_DATABASE_URL", 2, "OUTBOX_DATABASE_URL: is not a PostgreSQL URL")
	}
}

// A database the server does not have is one line naming it and the
// server, not pgx's chain of the connection attempt.
func TestAMissingDatabaseIsNamedWithItsServer(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/outbox_no_such_database_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	want := fmt.Sprintf("database %q does not exist on %s: create it", strings.TrimPrefix(u.Path, "/"), u.Host)
	for _, args := range [][]string{{"status"}, {"dead", "list"}, {"migrate", "status"}, {"invoke", "reaper"}} {
		name := strings.Join(args, " ")
		r := cli(t, db(u.String()), args...)
		r.wantError(t, name, 1, want)
		if r.err != nil && (strings.Contains(r.err.Error(), "SQLSTATE") || strings.Contains(r.err.Error(), "failed to connect")) {
			t.Errorf("%s: the error is pgx's chain: %v", name, r.err)
		}
	}
}
