package workload

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Summary is a latency distribution by nearest-rank percentiles.
type Summary struct {
	N                                   int
	Mean, P50, P90, P99, P999, Min, Max time.Duration
}

// Summarise sums up samples (a zero Summary for none).
func Summarise(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var total time.Duration
	for _, d := range s {
		total += d
	}
	return Summary{
		N: len(s), Mean: total / time.Duration(len(s)), Min: s[0], Max: s[len(s)-1],
		P50: rank(s, 0.50), P90: rank(s, 0.90), P99: rank(s, 0.99), P999: rank(s, 0.999),
	}
}

func rank(sorted []time.Duration, p float64) time.Duration {
	i := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func (s Summary) String() string {
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s, p99.9 %s, max %s (mean %s, n %d)",
		round(s.P50), round(s.P90), round(s.P99), round(s.P999), round(s.Max), round(s.Mean), s.N)
}

func round(d time.Duration) time.Duration {
	if d >= 10*time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}

// Measurement joins what was committed with what was received.
type Measurement struct {
	// Committed counts the ledger's messages; Received those of them the
	// target received; Missing those it did not; Unexpected the receipts
	// of messages the ledger does not know (none unless something else
	// enqueued).
	Committed, Received, Missing, Unexpected int
	// Latency is the commit-to-receipt distribution of the received
	// messages; Latencies the samples, in ascending order.
	Latency   Summary
	Latencies []time.Duration `json:"-"`
	// FirstCommit and LastReceipt bound the run; Throughput is Received
	// over that span, in messages per second.
	FirstCommit, LastReceipt time.Time
	Throughput               float64
	// EarlyReceipts counts receipts timed before their commit time (the
	// delivery beat the producer's clock reading after COMMIT); their
	// latency counts as zero.
	EarlyReceipts int

	// byCommit is every received message's commit time and latency, for
	// Windows.
	byCommit []committedSample
}

type committedSample struct {
	at      time.Time
	latency time.Duration
}

// Window is the latency of the messages committed in one span of a run.
type Window struct {
	// From is the span's start, from the first commit; the span is the
	// width Windows was given.
	From    time.Duration
	Latency Summary
}

// Windows groups the received messages by when they were committed, in
// spans of width from the first commit, each with its latency: where in
// the run a tail came from (a cold start's backlog, a stall), which the
// whole run's percentiles cannot say. A span without commits has N 0.
func (m Measurement) Windows(width time.Duration) []Window {
	if width <= 0 || len(m.byCommit) == 0 {
		return nil
	}
	var spans [][]time.Duration
	for _, s := range m.byCommit {
		i := int(s.at.Sub(m.FirstCommit) / width)
		for len(spans) <= i {
			spans = append(spans, nil)
		}
		spans[i] = append(spans[i], s.latency)
	}
	out := make([]Window, len(spans))
	for i, latencies := range spans {
		out[i] = Window{From: time.Duration(i) * width, Latency: Summarise(latencies)}
	}
	return out
}

// Receiver is a target that records each message's first arrival:
// *Target and *EventBus.
type Receiver interface {
	Receipts() map[uuid.UUID]time.Time
}

// Measure joins the ledger's commit times with the target's receipts.
func Measure(l *Ledger, t Receiver) Measurement {
	commits, receipts := l.CommitTimes(), t.Receipts()
	m := Measurement{Committed: len(commits)}
	m.Latencies = make([]time.Duration, 0, len(receipts))
	m.byCommit = make([]committedSample, 0, len(receipts))
	for id, committed := range commits {
		if m.FirstCommit.IsZero() || committed.Before(m.FirstCommit) {
			m.FirstCommit = committed
		}
		received, ok := receipts[id]
		if !ok {
			m.Missing++
			continue
		}
		m.Received++
		if received.After(m.LastReceipt) {
			m.LastReceipt = received
		}
		d := received.Sub(committed)
		if d < 0 {
			m.EarlyReceipts++
			d = 0
		}
		m.Latencies = append(m.Latencies, d)
		m.byCommit = append(m.byCommit, committedSample{committed, d})
	}
	for id := range receipts {
		if _, ok := commits[id]; !ok {
			m.Unexpected++
		}
	}
	slices.Sort(m.Latencies)
	m.Latency = Summarise(m.Latencies)
	if span := m.LastReceipt.Sub(m.FirstCommit); m.Received > 0 && span > 0 {
		m.Throughput = float64(m.Received) / span.Seconds()
	}
	return m
}

// P99s lists windows' p99s in order, "-" for a window without messages:
// one line that shows when in a run its tail was.
func P99s(windows []Window) string {
	parts := make([]string, len(windows))
	for i, w := range windows {
		parts[i] = "-"
		if w.Latency.N > 0 {
			parts[i] = round(w.Latency.P99).String()
		}
	}
	return strings.Join(parts, " ")
}

// ShareWithin is the share of received messages whose latency was at most d.
func (m Measurement) ShareWithin(d time.Duration) float64 {
	if len(m.Latencies) == 0 {
		return 0
	}
	n := sort.Search(len(m.Latencies), func(i int) bool { return m.Latencies[i] > d })
	return float64(n) / float64(len(m.Latencies))
}
