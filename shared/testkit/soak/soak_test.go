package soak_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxkit/dispatcher/shared/testkit/soak"
)

// TestQuickSoak is the soak the test suite runs: 20,000 messages through
// the real dispatch binaries, with kills, two PostgreSQL restarts (fast
// and immediate), a read-only turn, a lease takeover, a failing, slow and
// throttling target, a stuck key, rolled-back producer transactions, and
// the operator's outboxctl pausing and resuming a topic and replaying dead
// letters and parked keys. It asserts the guarantees (a paused message is
// held until its resume among them) and that each fault happened, never
// the speed: the run's own time limit is generous, and the figures are
// logged.
func TestQuickSoak(t *testing.T) {
	cfg := soak.QuickConfig()
	cfg.Log = logWriter{t}
	rep, err := soak.Run(context.Background(), cfg)
	if rep != nil {
		var b strings.Builder
		rep.WriteText(&b)
		t.Log(b.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Check(); err != nil {
		t.Fatal(err)
	}
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
