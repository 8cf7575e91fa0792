package workload_test

import (
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/testkit/workload"
)

// receipts is a Receiver with fixed receipt times.
type receipts map[uuid.UUID]time.Time

func (r receipts) Receipts() map[uuid.UUID]time.Time { return maps.Clone(r) }

// Windows puts each message in the span of its commit and says its
// latency there; a span nothing was committed in is empty, and a message
// never received is in none.
func TestWindowsGroupLatenciesByCommitTime(t *testing.T) {
	start := time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC)
	ledger, got := workload.NewLedger(), receipts{}
	for _, m := range []struct {
		committed, latency time.Duration
		received           bool
	}{
		{0, 1200 * time.Millisecond, true},
		{400 * time.Millisecond, 900 * time.Millisecond, true},
		{1100 * time.Millisecond, 50 * time.Millisecond, true},
		{1900 * time.Millisecond, 0, false},
		{3500 * time.Millisecond, 40 * time.Millisecond, true},
	} {
		id := uuid.New()
		ledger.Committed(start.Add(m.committed), id)
		if m.received {
			got[id] = start.Add(m.committed + m.latency)
		}
	}
	windows := workload.Measure(ledger, got).Windows(time.Second)
	want := []struct {
		n   int
		max time.Duration
	}{{2, 1200 * time.Millisecond}, {1, 50 * time.Millisecond}, {0, 0}, {1, 40 * time.Millisecond}}
	if len(windows) != len(want) {
		t.Fatalf("%d windows, want %d: %+v", len(windows), len(want), windows)
	}
	for i, w := range windows {
		if w.From != time.Duration(i)*time.Second || w.Latency.N != want[i].n || w.Latency.Max != want[i].max {
			t.Errorf("window %d: from %s, n %d, max %s; want from %ds, n %d, max %s", i, w.From, w.Latency.N, w.Latency.Max, i, want[i].n, want[i].max)
		}
	}
	if got, want := workload.P99s(windows), "1.2s 50ms - 40ms"; got != want {
		t.Errorf("P99s: %q, want %q", got, want)
	}
	if w := (workload.Measurement{}).Windows(time.Second); w != nil {
		t.Errorf("an empty measurement's windows: %+v", w)
	}
}
