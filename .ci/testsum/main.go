// Command testsum runs go test in each module of the repository, every
// module even when an earlier one failed, prints what go test prints
// without -v, and ends with one line of totals:
//
//	make test: 2 modules, 1843 tests passed, 0 failed, 12 skipped in 312 s
//
// It runs go test -json and reads the events, which name each test's
// outcome, rather than counting lines of the human-readable output, which a
// test's own output can imitate. Tests count subtests, as go test -json
// reports them. The exit status is 1 when anything failed: a test, a
// package that did not build or ended outside its tests (a panic, a
// timeout, TestMain), or a go test that exited non-zero without saying why
// in its events.
//
// gotestsum does this for one go test invocation; the repository's modules
// need one invocation each, and the summary has to span them, so the few
// lines of event reading are written here rather than another tool fetched
// by every fresh clone.
//
// Usage:
//
//	testsum [-label "make test"] [-go go] -modules ". shared/outbox" -- [go test flags] [packages]
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"time"
)

func main() {
	label := flag.String("label", "make test", "what the totals line starts with")
	goCmd := flag.String("go", "go", "the go command")
	modules := flag.String("modules", ".", "the directories of the modules to test, separated by spaces")
	flag.Parse()
	// Interrupted, go test's processes get the signal too (the terminal's
	// process group) and end; the totals then say what ran.
	interrupted := make(chan os.Signal, 1)
	signal.Notify(interrupted, os.Interrupt)
	os.Exit(run(os.Stdout, os.Stderr, *label, *goCmd, strings.Fields(*modules), flag.Args()))
}

// run tests each module in turn and returns the exit status.
func run(stdout, stderr io.Writer, label, goCmd string, modules, testArgs []string) int {
	start := time.Now()
	var total totals
	for _, dir := range modules {
		fmt.Fprintf(stdout, "== go test in %s\n", dir)
		r := &report{w: stdout, running: map[testKey]*bytes.Buffer{}, failedIn: map[string]int{}}
		cmd := exec.Command(goCmd, append([]string{"test", "-json"}, testArgs...)...)
		cmd.Dir = dir
		cmd.Stderr = stderr
		events, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			fmt.Fprintf(stdout, "go test in %s did not start: %v\n", dir, err)
			total.unexplained++
			continue
		}
		r.read(events)
		err = cmd.Wait()
		r.endUnfinished()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			fmt.Fprintf(stderr, "%s: go test in %s: %v\n", label, dir, err)
		}
		if err != nil && r.failed == 0 && r.packagesFailed == 0 {
			// go test failed without a failing test or package in its
			// events: a pattern that matched nothing, a go.mod it could
			// not read. Its reason went to stderr above.
			fmt.Fprintf(stdout, "go test in %s failed outside any test: %v\n", dir, err)
			total.unexplained++
		}
		total.add(r.totals)
	}
	fmt.Fprintln(stdout, total.line(label, len(modules), time.Since(start)))
	if total.failed+total.packagesFailed+total.unexplained > 0 {
		return 1
	}
	return 0
}

type totals struct {
	passed, failed, skipped int
	// packagesFailed are packages that failed with none of their tests
	// failing: a build failure, a panic or timeout outside a test.
	packagesFailed int
	// unexplained are go test runs that failed without an event saying
	// why.
	unexplained int
}

func (t *totals) add(o totals) {
	t.passed += o.passed
	t.failed += o.failed
	t.skipped += o.skipped
	t.packagesFailed += o.packagesFailed
	t.unexplained += o.unexplained
}

func (t totals) line(label string, modules int, took time.Duration) string {
	s := fmt.Sprintf("%s: %d module%s, %d test%s passed, %d failed, %d skipped",
		label, modules, plural(modules), t.passed, plural(t.passed), t.failed, t.skipped)
	if t.packagesFailed > 0 {
		s += fmt.Sprintf(", %d package%s failed outside %s tests (build, panic or timeout)",
			t.packagesFailed, plural(t.packagesFailed), map[bool]string{true: "its", false: "their"}[t.packagesFailed == 1])
	}
	if t.unexplained > 0 {
		s += fmt.Sprintf(", go test failed in %d module%s", t.unexplained, plural(t.unexplained))
	}
	return s + fmt.Sprintf(" in %d s", int(took.Round(time.Second)/time.Second))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// event is what go test -json writes: a test event (cmd/test2json's
// TestEvent) or a build event (ImportPath set).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	FailedBuild string
	ImportPath  string
}

// testKey is a top-level test of a package; its subtests' output is kept
// with it, as go test prints them together.
type testKey struct{ pkg, test string }

// report reads one go test's events and prints what go test prints without
// -v: a failed test's output, package lines (ok, FAIL, no test files) and
// build errors.
type report struct {
	w io.Writer
	totals
	// running holds the output of each top-level test not yet ended,
	// and of each package (test "") not yet ended.
	running map[testKey]*bytes.Buffer
	// failedIn counts the failed tests of each package.
	failedIn map[string]int
}

func (r *report) read(events io.Reader) {
	in := bufio.NewReader(events)
	for {
		line, err := in.ReadBytes('\n')
		if len(line) > 0 {
			var e event
			if json.Unmarshal(line, &e) != nil || e.Action == "" {
				r.w.Write(line) // not an event: shown as it came
			} else {
				r.handle(e)
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *report) handle(e event) {
	if e.ImportPath != "" {
		if e.Action == "build-output" {
			io.WriteString(r.w, e.Output)
		}
		return
	}
	if e.Test == "" {
		switch e.Action {
		case "output":
			if strings.TrimSpace(e.Output) != "PASS" { // go test without -v prints ok alone
				r.packageOutput(e.Package).WriteString(e.Output)
			}
		case "fail":
			r.endPackage(e.Package)
			if r.failedIn[e.Package] == 0 {
				r.packagesFailed++
			}
		case "pass", "skip":
			r.endPackage(e.Package)
		}
		return
	}
	top, _, sub := strings.Cut(e.Test, "/")
	key := testKey{e.Package, top}
	switch e.Action {
	case "run":
		if !sub {
			r.running[key] = &bytes.Buffer{}
		}
	case "output":
		if b := r.running[key]; b != nil {
			b.WriteString(e.Output)
		}
	case "pass":
		r.passed++
	case "skip":
		r.skipped++
	case "fail":
		r.failed++
		r.failedIn[e.Package]++
	}
	if !sub && (e.Action == "pass" || e.Action == "skip" || e.Action == "fail") {
		if e.Action == "fail" {
			r.printTest(r.running[key])
		}
		delete(r.running, key)
	}
}

// packageOutput is the buffer of the package's own lines (ok, FAIL, a
// panic's trace), printed when it ends, after its tests' output.
func (r *report) packageOutput(pkg string) *bytes.Buffer {
	key := testKey{pkg: pkg}
	if r.running[key] == nil {
		r.running[key] = &bytes.Buffer{}
	}
	return r.running[key]
}

// endPackage prints the output of the package's tests that never ended (a
// panic or a timeout stopped them), counting them as failed, and then the
// package's own lines.
func (r *report) endPackage(pkg string) {
	for key, b := range r.running {
		if key.pkg == pkg && key.test != "" {
			r.failed++
			r.failedIn[pkg]++
			r.printTest(b)
			delete(r.running, key)
		}
	}
	if b := r.running[testKey{pkg: pkg}]; b != nil {
		r.w.Write(b.Bytes())
		delete(r.running, testKey{pkg: pkg})
	}
}

// endUnfinished ends whatever go test left running when it exited.
func (r *report) endUnfinished() {
	for key := range r.running {
		r.endPackage(key.pkg)
	}
}

// printTest writes a failed test's output without the markers of -v, as
// go test shows a failure without -v.
func (r *report) printTest(b *bytes.Buffer) {
	if b == nil {
		return
	}
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		if isMarker(line) {
			continue
		}
		io.WriteString(r.w, line)
	}
}

func isMarker(line string) bool {
	line = strings.TrimLeft(line, " ")
	for _, m := range []string{"=== RUN ", "=== PAUSE ", "=== CONT ", "=== NAME "} {
		if strings.HasPrefix(line, m) {
			return true
		}
	}
	return false
}
