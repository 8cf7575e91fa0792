package infra_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// make test runs every module's tests even when an earlier module's
// failed, shows a failure as go test does, and ends with one line of
// totals, exiting non-zero. Two modules of its own stand in for the
// repository's (MODULES), so that the test does not run the suite.
func TestMakeTestRunsEveryModuleAndEndsWithTotals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	module := func(name string, files map[string]string) string {
		t.Helper()
		root := filepath.Join(dir, name)
		files["go.mod"] = "module example.com/" + name + "\n\ngo 1.24\n"
		for file, text := range files {
			path := filepath.Join(root, file)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return root
	}
	failing := module("failing", map[string]string{
		"a/a_test.go": `package a

import "testing"

func TestQuiet(t *testing.T) { t.Log("the log of a passing test") }

func TestBroken(t *testing.T) {
	t.Run("case", func(t *testing.T) { t.Error("the reason it failed") })
}
`,
		"b/b_test.go": "package b\n\nimport \"testing\"\n\nfunc TestSkipped(t *testing.T) { t.Skip(\"not here\") }\n",
		"c/c.go":      "package c\n\nfunc broken( {\n",
		"c/c_test.go": "package c\n",
	})
	passing := module("passing", map[string]string{
		"p/p_test.go": "package p\n\nimport \"testing\"\n\nfunc TestOne(t *testing.T) {}\n\nfunc TestTwo(t *testing.T) {}\n",
	})
	makeTest := func(modules ...string) (string, error) {
		cmd := exec.Command("make", "-s", "--no-print-directory", "-C", "..", "test-modules", "MODULES="+strings.Join(modules, " "))
		out, err := cmd.Output() // stdout: make's own error line goes to stderr
		return string(out), err
	}

	out, err := makeTest(failing, passing)
	if err == nil {
		t.Errorf("make test exited 0 with a failing test:\n%s", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	last := lines[len(lines)-1]
	// TestQuiet, TestOne and TestTwo pass; TestBroken and its case fail.
	want := regexp.MustCompile(`^make test: 2 modules, 3 tests passed, 2 failed, 1 skipped, 1 package failed outside its tests \(build, panic or timeout\) in \d+ s$`)
	if !want.MatchString(last) {
		t.Errorf("make test's last line = %q, want it to match %s", last, want)
	}
	for _, want := range []string{
		"== go test in " + failing, "== go test in " + passing, // the second module ran after the first failed
		"the reason it failed", "--- FAIL: TestBroken",
		"FAIL\texample.com/failing/a", "ok  \texample.com/passing/p",
		"syntax error", // the package that did not build
	} {
		if !strings.Contains(out, want) {
			t.Errorf("make test's output lacks %q:\n%s", want, out)
		}
	}
	for _, noise := range []string{"the log of a passing test", "=== RUN", "--- PASS", "--- SKIP"} {
		if strings.Contains(out, noise) {
			t.Errorf("make test's output has %q, which go test without -v does not show:\n%s", noise, out)
		}
	}

	out, err = makeTest(passing)
	if err != nil {
		t.Errorf("make test on a passing module: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`\nmake test: 1 module, 2 tests passed, 0 failed, 0 skipped in \d+ s\n$`).MatchString(out) {
		t.Errorf("make test on a passing module does not end with its totals:\n%s", out)
	}

	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^test: test-postgres test-modules `).Match(makefile) || !strings.Contains(string(makefile), "-- -race -count=1 -timeout 30m ./...") {
		t.Error("make test does not check PostgreSQL and then run test-modules with -race -count=1 over each module's ./...")
	}
}

// make help shows the descriptions as make would run them: a variable a
// description names is expanded, not printed as $(NAME).
func TestMakeHelpExpandsVariables(t *testing.T) {
	t.Parallel()
	for arch, want := range map[string]string{"": "linux/arm64", "amd64": "linux/amd64"} {
		args := []string{"-s", "--no-print-directory", "-C", "..", "help"}
		if arch != "" {
			args = append(args, "LAMBDA_ARCH="+arch)
		}
		out, err := exec.Command("make", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("make help: %v\n%s", err, out)
		}
		if strings.Contains(string(out), "$(") || !strings.Contains(string(out), want) {
			t.Errorf("make %s: want %s and no unexpanded variable:\n%s", strings.Join(args[4:], " "), want, out)
		}
	}
}
