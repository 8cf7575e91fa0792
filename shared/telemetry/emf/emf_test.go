package emf_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
	"github.com/outboxkit/dispatcher/shared/testkit/emftest"
)

var fn = emf.Dimension{Name: "FunctionName", Value: "outbox-dispatch"}

func newLogger(t *testing.T, defaults ...emf.Dimension) *emf.Logger {
	t.Helper()
	m, err := emf.New("Outbox", defaults...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func flush(t *testing.T, m *emf.Logger) []emftest.Document {
	t.Helper()
	var out bytes.Buffer
	if err := m.Flush(&out); err != nil {
		t.Fatal(err)
	}
	return emftest.Parse(t, out.Bytes())
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestRoundTripOfValuesUnitsDimensionsAndProperties(t *testing.T) {
	t.Parallel()
	m := newLogger(t, fn)
	at := time.Date(2026, 3, 1, 3, 4, 5, 678_000_000, time.UTC)
	m.SetTimestamp(at)
	must(t, m.SetProperty("request_id", "c6af9ac6-7b61-11e6-9a41-93e812345678"))
	must(t, m.SetProperty("worker_id", "dispatch-1"))
	must(t, m.Put("Claimed", 500, emf.Count))
	must(t, m.Put("Delivered", 497, emf.Count))
	must(t, m.Put("DispatchLatency", 12.5, emf.Milliseconds))
	must(t, m.Put("DispatchLatency", 40, emf.Milliseconds))
	must(t, m.Put("DispatchLatency", 7.25, emf.Milliseconds))
	must(t, m.Put("Throughput", 1e-3, emf.CountPerSecond))
	must(t, m.Put("Negative", -42, emf.None))

	docs := flush(t, m)
	if len(docs) != 1 {
		t.Fatalf("%d documents, want 1", len(docs))
	}
	d := docs[0]
	if d.Namespace != "Outbox" || d.Timestamp != at.UnixMilli() {
		t.Errorf("namespace %q, timestamp %d; want Outbox, %d", d.Namespace, d.Timestamp, at.UnixMilli())
	}
	if fmt.Sprint(d.Sets) != "[[FunctionName]]" || d.Dimensions["FunctionName"] != "outbox-dispatch" {
		t.Errorf("dimensions %v %v", d.Sets, d.Dimensions)
	}
	if d.Properties["request_id"] != "c6af9ac6-7b61-11e6-9a41-93e812345678" || d.Properties["worker_id"] != "dispatch-1" {
		t.Errorf("properties %v", d.Properties)
	}
	want := map[string]struct {
		unit   string
		values []float64
	}{
		"Claimed":         {"Count", []float64{500}},
		"Delivered":       {"Count", []float64{497}},
		"DispatchLatency": {"Milliseconds", []float64{12.5, 40, 7.25}},
		"Throughput":      {"Count/Second", []float64{1e-3}},
		"Negative":        {"None", []float64{-42}},
	}
	if len(d.Metrics) != len(want) {
		t.Errorf("metrics %v", d.Metrics)
	}
	for name, w := range want {
		got := d.Metrics[name]
		if got.Unit != w.unit || !slices.Equal(got.Values, w.values) {
			t.Errorf("%s = %v %v, want %v %v", name, got.Values, got.Unit, w.values, w.unit)
		}
	}
	if !slices.Equal(d.Order, []string{"Claimed", "Delivered", "DispatchLatency", "Throughput", "Negative"}) {
		t.Errorf("definitions in order %v, want the order of first put", d.Order)
	}
}

func TestEveryUnitRoundTrips(t *testing.T) {
	t.Parallel()
	m := newLogger(t)
	for i, u := range emf.Units {
		if !u.Valid() {
			t.Fatalf("%q is listed in Units but not Valid", u)
		}
		must(t, m.Put(fmt.Sprintf("M%02d", i), float64(i), u))
	}
	docs := flush(t, m)
	if len(docs) != 1 || len(docs[0].Metrics) != 27 {
		t.Fatalf("%d documents; want one with the 27 CloudWatch units", len(docs))
	}
	for i, u := range emf.Units {
		got := docs[0].Metrics[fmt.Sprintf("M%02d", i)]
		if got.Unit != string(u) || got.Values[0] != float64(i) {
			t.Errorf("M%02d: %v %s, want %d %s", i, got.Values, got.Unit, i, u)
		}
	}
	// Without any dimension, the one dimension set the specification
	// requires is empty.
	if fmt.Sprint(docs[0].Sets) != "[[]]" {
		t.Errorf("dimension sets %v, want [[]]", docs[0].Sets)
	}
}

func TestMoreThan100MetricsSplitIntoDocuments(t *testing.T) {
	t.Parallel()
	m := newLogger(t, fn)
	must(t, m.SetProperty("request_id", "r-1"))
	want := map[string]float64{}
	for i := range 101 {
		name := fmt.Sprintf("Metric%03d", i)
		want[name] = float64(i * 10)
		must(t, m.Put(name, float64(i*10), emf.Count))
	}
	docs := flush(t, m)
	if len(docs) != 2 {
		t.Fatalf("%d documents, want 2", len(docs))
	}
	got := map[string]float64{}
	for _, d := range docs {
		if d.Dimensions["FunctionName"] != "outbox-dispatch" || d.Properties["request_id"] != "r-1" {
			t.Errorf("a split document lost its dimensions or properties: %v %v", d.Dimensions, d.Properties)
		}
		for name, v := range d.Metrics {
			if _, dup := got[name]; dup {
				t.Errorf("%s written twice: CloudWatch would count it twice", name)
			}
			got[name] = v.Values[0]
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("metrics after the split differ:\n got %v\nwant %v", got, want)
	}
	if len(docs[0].Metrics) != 100 || len(docs[1].Metrics) != 1 {
		t.Errorf("split %d + %d, want 100 + 1", len(docs[0].Metrics), len(docs[1].Metrics))
	}
}

func TestMoreThan100ValuesSplitWithTotalsPreserved(t *testing.T) {
	t.Parallel()
	m := newLogger(t, fn)
	var wantSum float64
	for i := range 250 {
		v := float64(i%37) + 0.5
		wantSum += v
		must(t, m.Put("DispatchLatency", v, emf.Milliseconds))
	}
	must(t, m.Put("Claimed", 250, emf.Count))

	docs := flush(t, m)
	if len(docs) != 3 {
		t.Fatalf("%d documents, want 3 (100 + 100 + 50 values)", len(docs))
	}
	var n, claimed int
	var sum float64
	for _, d := range docs {
		lat := d.Metrics["DispatchLatency"]
		if lat.Unit != "Milliseconds" {
			t.Errorf("unit %q", lat.Unit)
		}
		n += len(lat.Values)
		for _, v := range lat.Values {
			sum += v
		}
		if c, ok := d.Metrics["Claimed"]; ok {
			claimed++
			if c.Values[0] != 250 {
				t.Errorf("Claimed = %v", c.Values)
			}
		}
	}
	if n != 250 || sum != wantSum {
		t.Errorf("%d values summing to %g, want 250 summing to %g", n, sum, wantSum)
	}
	if claimed != 1 {
		t.Errorf("Claimed in %d documents, want exactly 1", claimed)
	}
}

func TestDistinctDimensionValuesGoToSeparateDocuments(t *testing.T) {
	t.Parallel()
	m := newLogger(t, fn)
	must(t, m.RollUp([]string{"FunctionName"}, []string{"Namespace"}))
	type key struct{ ns, topic string }
	want := map[key]float64{}
	for i, ns := range []string{"billing", "payments", "mini-chat"} {
		for j, topic := range []string{"usage", "invoice"} {
			depth := float64(i*10 + j)
			want[key{ns, topic}] = depth
			dims := []emf.Dimension{{Name: "Namespace", Value: ns}, {Name: "Topic", Value: topic}}
			must(t, m.PutWith(dims, "PendingDepth", depth, emf.Count))
			must(t, m.PutWith(dims, "OldestPendingAgeSeconds", depth*2, emf.Seconds))
		}
	}
	// The same combination listed in another order is the same document.
	must(t, m.PutWith([]emf.Dimension{{Name: "Topic", Value: "usage"}, {Name: "Namespace", Value: "billing"}}, "DeadLetterDepth", 1, emf.Count))
	must(t, m.Put("Claimed", 3, emf.Count))

	docs := flush(t, m)
	if len(docs) != 7 {
		t.Fatalf("%d documents, want 6 (one per namespace/topic) + 1 (default dimensions)", len(docs))
	}
	got := map[key]float64{}
	for _, d := range docs {
		if d.Dimensions["FunctionName"] != "outbox-dispatch" {
			t.Errorf("document without the default dimension: %v", d.Dimensions)
		}
		if _, ok := d.Metrics["Claimed"]; ok {
			if len(d.Metrics) != 1 || fmt.Sprint(d.Sets) != "[[FunctionName]]" {
				t.Errorf("default document: metrics %v, sets %v", d.Metrics, d.Sets)
			}
			continue
		}
		k := key{d.Dimensions["Namespace"], d.Dimensions["Topic"]}
		if _, dup := got[k]; dup {
			t.Errorf("%v in two documents", k)
		}
		got[k] = d.Metrics["PendingDepth"].Values[0]
		if d.Metrics["OldestPendingAgeSeconds"].Values[0] != got[k]*2 {
			t.Errorf("%v: age %v", k, d.Metrics["OldestPendingAgeSeconds"])
		}
		if want := "[[FunctionName Namespace Topic] [FunctionName] [Namespace]]"; fmt.Sprint(d.Sets) != want {
			t.Errorf("%v: dimension sets %v, want %s", k, d.Sets, want)
		}
		if _, ok := d.Metrics["DeadLetterDepth"]; ok != (k == key{"billing", "usage"}) {
			t.Errorf("%v: DeadLetterDepth present = %v", k, ok)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestDimensionLimit(t *testing.T) {
	t.Parallel()
	dims := func(n int, prefix string) []emf.Dimension {
		out := make([]emf.Dimension, n)
		for i := range out {
			out[i] = emf.Dimension{Name: fmt.Sprintf("%s%d", prefix, i), Value: "v"}
		}
		return out
	}
	if _, err := emf.New("Outbox", dims(31, "D")...); !errors.Is(err, emf.ErrTooManyDimensions) {
		t.Errorf("31 default dimensions: %v, want ErrTooManyDimensions", err)
	}
	m := newLogger(t, dims(10, "D")...)
	if err := m.PutWith(dims(21, "E"), "M", 1, emf.Count); !errors.Is(err, emf.ErrTooManyDimensions) {
		t.Errorf("10 + 21 dimensions: %v, want ErrTooManyDimensions", err)
	}
	keys := make([]string, 31)
	for i := range keys {
		keys[i] = fmt.Sprintf("K%d", i)
	}
	if err := m.RollUp(keys); !errors.Is(err, emf.ErrTooManyDimensions) {
		t.Errorf("roll-up of 31 keys: %v, want ErrTooManyDimensions", err)
	}
	// Exactly 30 is allowed, and valid.
	must(t, m.PutWith(dims(20, "E"), "M", 1, emf.Count))
	docs := flush(t, m)
	if len(docs) != 1 || len(docs[0].Sets[0]) != 30 || len(docs[0].Metrics) != 1 {
		t.Fatalf("30 dimensions: %+v", docs)
	}
}

func TestInvalidMetricsAreRefusedAndLeaveNoTrace(t *testing.T) {
	t.Parallel()
	m := newLogger(t, fn)
	must(t, m.SetProperty("request_id", "r-1"))
	must(t, m.Put("Claimed", 1, emf.Count))
	long := strings.Repeat("x", 256)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"lower-case unit", m.Put("Bad1", 1, emf.Unit("count")), emf.ErrInvalidUnit},
		{"singular unit", m.Put("Bad2", 1, emf.Unit("Millisecond")), emf.ErrInvalidUnit},
		{"empty unit", m.Put("Bad3", 1, ""), emf.ErrInvalidUnit},
		{"NaN", m.Put("Bad4", math.NaN(), emf.Count), emf.ErrInvalidValue},
		{"+Inf", m.Put("Bad5", math.Inf(1), emf.Count), emf.ErrInvalidValue},
		{"-Inf", m.Put("Bad6", math.Inf(-1), emf.Count), emf.ErrInvalidValue},
		{"beyond 2^360", m.Put("Bad7", math.Ldexp(1, 361), emf.Count), emf.ErrInvalidValue},
		{"empty name", m.Put("", 1, emf.Count), emf.ErrInvalidName},
		{"blank name", m.Put("  ", 1, emf.Count), emf.ErrInvalidName},
		{"256-character name", m.Put(long, 1, emf.Count), emf.ErrInvalidName},
		{"reserved name", m.Put("_aws", 1, emf.Count), emf.ErrInvalidName},
		{"empty dimension value", m.PutWith([]emf.Dimension{{Name: "Topic", Value: ""}}, "Bad8", 1, emf.Count), emf.ErrInvalidValue},
		{"empty dimension name", m.PutWith([]emf.Dimension{{Name: "", Value: "x"}}, "Bad9", 1, emf.Count), emf.ErrInvalidName},
		{"dimension twice", m.PutWith([]emf.Dimension{{Name: "T", Value: "a"}, {Name: "T", Value: "b"}}, "Bad10", 1, emf.Count), emf.ErrConflict},
		{"dimension overriding a default", m.PutWith([]emf.Dimension{{Name: "FunctionName", Value: "other"}}, "Bad11", 1, emf.Count), emf.ErrConflict},
		{"metric named like its dimension", m.Put("FunctionName", 1, emf.Count), emf.ErrConflict},
		{"metric named like a property", m.Put("request_id", 1, emf.Count), emf.ErrConflict},
		{"unit changed", m.Put("Claimed", 1, emf.Seconds), emf.ErrConflict},
		{"property named like a metric", m.SetProperty("Claimed", "x"), emf.ErrConflict},
		{"property named like a secret", m.SetProperty("db_password", "x"), emf.ErrInvalidName},
		{"property that is not JSON", m.SetProperty("callback", func() {}), emf.ErrInvalidValue},
	}
	for _, tc := range cases {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	for _, ns := range []string{"", long, "AWS/Lambda"} {
		if _, err := emf.New(ns); !errors.Is(err, emf.ErrInvalidName) {
			t.Errorf("namespace %.20q: %v, want ErrInvalidName", ns, err)
		}
	}
	// What was refused is not written; what was accepted still is.
	docs := flush(t, m)
	if len(docs) != 1 || len(docs[0].Metrics) != 1 || docs[0].Metrics["Claimed"].Values[0] != 1 {
		t.Fatalf("after refusals: %+v", docs)
	}
}

func TestFlushForgetsMetricsAndKeepsProperties(t *testing.T) {
	t.Parallel()
	m := newLogger(t, fn)
	must(t, m.SetProperty("request_id", "r-1"))
	must(t, m.Put("Claimed", 5, emf.Count))
	if docs := flush(t, m); len(docs) != 1 {
		t.Fatalf("%d documents", len(docs))
	}
	var out bytes.Buffer
	must(t, m.Flush(&out))
	if out.Len() != 0 {
		t.Fatalf("a second Flush wrote %q, want nothing", out.String())
	}
	must(t, m.Put("Claimed", 7, emf.Count))
	docs := flush(t, m)
	if len(docs) != 1 || docs[0].Metrics["Claimed"].Values[0] != 7 || docs[0].Properties["request_id"] != "r-1" {
		t.Fatalf("after a flush: %+v", docs)
	}
	if now := time.Now().UnixMilli(); docs[0].Timestamp < now-60_000 || docs[0].Timestamp > now+1000 {
		t.Errorf("default timestamp %d, want about now (%d)", docs[0].Timestamp, now)
	}
}

func TestConcurrentPuts(t *testing.T) {
	t.Parallel()
	m := newLogger(t, fn)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				if err := m.Put("DispatchLatency", float64(w*1000+i), emf.Milliseconds); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	seen := map[float64]bool{}
	for _, d := range flush(t, m) {
		for _, v := range d.Metrics["DispatchLatency"].Values {
			seen[v] = true
		}
	}
	if len(seen) != 4000 {
		t.Fatalf("%d distinct values, want 4000", len(seen))
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("stdout closed") }

func TestFlushReportsWriteErrors(t *testing.T) {
	t.Parallel()
	m := newLogger(t)
	must(t, m.Put("Claimed", 1, emf.Count))
	if err := m.Flush(failingWriter{}); err == nil || !strings.Contains(err.Error(), "stdout closed") {
		t.Fatalf("Flush = %v, want the write error", err)
	}
}

// BenchmarkPutWithADimension is the dispatch function's per-message
// metric: one value of DispatchLatency under its TargetType dimension.
//
//	go test -run '^$' -bench PutWithADimension -benchmem ./shared/telemetry/emf
func BenchmarkPutWithADimension(b *testing.B) {
	m, err := emf.New("Outbox", fn)
	if err != nil {
		b.Fatal(err)
	}
	dims := []emf.Dimension{{Name: "TargetType", Value: "eventbridge"}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := m.PutWith(dims, "DispatchLatency", float64(i%1000), emf.Milliseconds); err != nil {
			b.Fatal(err)
		}
		if i%10000 == 9999 {
			b.StopTimer()
			_ = m.Flush(io.Discard)
			b.StartTimer()
		}
	}
}
