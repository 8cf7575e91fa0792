package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

var (
	buildOnce sync.Once
	buildDir  string
	builtPath string
	buildErr  error
)

// removeBuiltOutboxctl deletes the binary buildOutboxctl made (TestMain).
func removeBuiltOutboxctl() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// buildOutboxctl compiles this command once per test binary, to run it as
// a separate process that receives real signals.
func buildOutboxctl(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "outboxctl-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		builtPath = filepath.Join(dir, "outboxctl")
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", builtPath, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = err
			builtPath = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build outboxctl: %v\n%s", buildErr, builtPath)
	}
	return builtPath
}

// processEnv is the test process's environment without OUTBOX_* variables,
// plus vars.
func processEnv(vars ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			env = append(env, kv)
		}
	}
	return append(env, vars...)
}

// TestServeSIGTERMMidBatchLosesNothing runs `outboxctl serve` as a process
// against a slow endpoint and sends it SIGTERM while a batch is being
// delivered: the process must finish that batch — deliver it and record it
// — and exit 0, leaving every other message pending and nothing leased.
func TestServeSIGTERMMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	bin := buildOutboxctl(t)
	d := pgtest.New(t)
	// 16 messages a batch, 8 requests at a time, 300ms each: a batch is in
	// flight for about 600ms.
	snk, url := startSink(t, 300*time.Millisecond)
	const total = 200
	var msgs []outbox.Message
	for i := range total {
		msgs = append(msgs, usageMessage(i))
	}
	enqueueMessages(t, d.Pool, msgs...)

	cmd := exec.Command(bin, "serve", "--batch-size", "16", "--reaper-interval", "0")
	cmd.Env = processEnv("OUTBOX_DATABASE_URL="+d.URL, "OUTBOX_ROUTES="+routesTo(url), "SINK_SECRET="+testSecret,
		"OUTBOX_TRACING=off")
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	// The first answers of the first batch have come back; the rest of
	// the batch is still in flight.
	waitFor(t, 30*time.Second, "the first delivery", func() bool { return snk.handledKeys() > 0 })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("serve exited with %v after SIGTERM\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not exit within a minute of SIGTERM")
	}

	delivered := countRows(t, d.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`)
	pending := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending`)
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.pending WHERE lease_token IS NOT NULL`); n != 0 {
		t.Errorf("%d messages left leased", n)
	}
	if n := countRows(t, d.Pool, `SELECT count(*) FROM outbox.attempts WHERE state <> 'DISPATCHED'`); n != 0 {
		t.Errorf("%d outcomes other than delivered: the batch in hand was cut short", n)
	}
	if delivered+pending != total {
		t.Errorf("%d delivered + %d pending = %d, want %d: messages were lost", delivered, pending, delivered+pending, total)
	}
	if delivered == 0 || delivered%16 != 0 || delivered == total {
		t.Errorf("%d delivered, want whole batches of 16, and not everything: the signal should stop the claiming", delivered)
	}
	stats, _ := snk.snapshot()
	if snk.handledKeys() != delivered || stats.MaxHandledPerKey != 1 {
		t.Errorf("the endpoint handled %d keys (at most %d times each); the database recorded %d deliveries", snk.handledKeys(), stats.MaxHandledPerKey, delivered)
	}
	if !strings.Contains(stdout.String(), `"serve stopped"`) {
		t.Errorf("no shutdown log line:\n%s", stdout.String())
	}
}
