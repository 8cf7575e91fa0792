package infra_test

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// make test without a server says so once, with how to start one, instead
// of failing every database test with the same hint.
func TestMakeTestChecksForPostgreSQLOnce(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("pg_isready"); err != nil {
		t.Skip("pg_isready is not on the PATH: make test's check is skipped there too")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	cmd := exec.Command("make", "-s", "-C", "..", "test-postgres", "OUTBOX_TEST_DATABASE_URL=postgres://tester:hunter2@"+addr+"/test?sslmode=disable")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("make test-postgres succeeded with no server at %s:\n%s", addr, out)
	}
	text := string(out)
	if strings.Count(text, "no PostgreSQL answers at postgres://tester:xxxxx@"+addr) != 1 || strings.Count(text, "pg_ctlcluster") != 1 {
		t.Errorf("make test-postgres should name the server once and how to start one:\n%s", text)
	}
	if strings.Contains(text, "hunter2") {
		t.Errorf("make test-postgres shows the password:\n%s", text)
	}
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "test: test-postgres") {
		t.Error("make test does not run the check first")
	}
}

// make run builds bin/outboxctl — the binary the demo's closing lines use
// — and passes ARGS to the demo.
func TestMakeRunPassesArgs(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("make", "-n", "-C", "..", "run", "ARGS=--messages 500 --tenants 3").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, out)
	}
	text := string(out)
	for _, want := range []string{"-o bin/outboxctl ./cmd/outboxctl", "bin/outboxctl demo --messages 500 --tenants 3", "compiling outboxctl"} {
		if !strings.Contains(text, want) {
			t.Errorf("make -n run does not run %q:\n%s", want, text)
		}
	}
}
