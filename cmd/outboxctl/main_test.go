package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// run executes outboxctl in-process with args and returns its output, its
// error and the exit code main would use.
func run(t *testing.T, env map[string]string, args ...string) (string, error, int) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	code := 0
	if err != nil {
		code = exitCode(err)
	}
	return out.String(), err, code
}

func TestMigrateUpStatusDown(t *testing.T) {
	url := pgtest.NewEmpty(t)
	out, err, _ := run(t, nil, "migrate", "up", "--database-url", url)
	if err != nil || !strings.Contains(out, "applied 00001_baseline.sql") {
		t.Fatalf("migrate up: %v\n%s", err, out)
	}
	out, err, _ = run(t, map[string]string{"OUTBOX_DATABASE_URL": url}, "migrate", "up")
	if err != nil || !strings.Contains(out, "up to date") {
		t.Fatalf("second migrate up: %v\n%s", err, out)
	}
	out, err, _ = run(t, nil, "migrate", "status", "--database-url", url)
	if err != nil || strings.Contains(out, "pending") || !strings.Contains(out, "applied  00001") {
		t.Fatalf("migrate status: %v\n%s", err, out)
	}
	out, err, _ = run(t, nil, "migrate", "down", "--to", "0", "--database-url", url)
	if err != nil || !strings.Contains(out, "rolled back 00001_baseline.sql") {
		t.Fatalf("migrate down --to 0: %v\n%s", err, out)
	}
	out, _, _ = run(t, nil, "migrate", "status", "--database-url", url)
	if strings.Contains(out, "applied") {
		t.Fatalf("status after down shows applied migrations:\n%s", out)
	}
}

func TestMigrateBadInput(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want string
		code int
	}{
		{[]string{"migrate"}, nil, "needs a subcommand", 2},
		{[]string{"migrate", "sideways"}, nil, `unknown migrate subcommand "sideways"`, 2},
		{[]string{"migrate", "up", "--frobnicate"}, nil, "unknown flag: --frobnicate", 2},
		{[]string{"migrate", "down", "--to", "x", "--database-url", "postgres://nobody@127.0.0.1:1/x"}, nil, "--to must be a migration version", 2},
		{[]string{"migrate", "up"}, map[string]string{"OUTBOX_DATABASE_URL": ""}, "no database: set OUTBOX_DATABASE_URL", 2},
		{[]string{"migrate", "up", "--database-url", "postgres://nobody:hunter2@127.0.0.1:1/x?connect_timeout=2"}, nil, "connect", 1},
	}
	for _, tc := range cases {
		_, err, code := run(t, tc.env, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || code != tc.code {
			t.Errorf("%v: err %v (exit %d), want %q (exit %d)", tc.args, err, code, tc.want, tc.code)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%v: the error shows the password: %v", tc.args, err)
		}
		if err != nil && strings.Contains(oneLine(err), "\n") {
			t.Errorf("%v: error is more than one line", tc.args)
		}
	}
}
