package dispatchfn_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/fanout"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/eventfuzz"
)

// FuzzParseEvent: the dispatch function's event comes from a schedule or
// an operator. Whatever arrives, ParseEvent must not panic, must refuse
// with an *handler.EventError, and must accept only overrides the engine
// can run: batch_size 0 (the configured one) to config.MaxBatchSize,
// max_batches 0 to 1000, namespaces that are namespaces. An accepted event
// re-encoded and parsed again means the same.
func FuzzParseEvent(f *testing.F) {
	for _, s := range append(eventfuzz.Seeds,
		`{"batch_size":500,"namespaces":["mini-chat"],"max_batches":10}`,
		`{"batch_size":0,"max_batches":0,"namespaces":[]}`,
		`{"batch_size":-1}`, `{"batch_size":10001}`, `{"max_batches":1001}`, `{"batch_size":1.5}`,
		`{"batch_size":"500"}`, `{"batch_size":9223372036854775808}`, `{"namespaces":"mini-chat"}`,
		`{"namespaces":[""]}`, `{"namespaces":["a b"]}`, `{"namespaces":["*"]}`, `{"namespaces":[null]}`,
		`{"namespaces":["`+string(make([]byte, 129))+`"]}`,
		`{"Batch_Size":5}`, `{"batch_size":5,"extra":true}`,
		`{"version":"0","id":"53dc4d37","detail-type":"Scheduled Event","source":"aws.events","account":"123456789012","time":"2026-11-21T03:00:00Z","region":"eu-west-1","resources":["arn:aws:events:eu-west-1:123456789012:rule/outbox-dispatch"],"detail":{}}`,
		`{"detail-type":"Scheduled Event","detail":{"batch_size":50,"namespaces":["billing"]}}`,
		`{"detail-type":"Scheduled Event","detail":{"batch_size":-5}}`,
		`{"detail-type":"Scheduled Event","source":"aws.events","unexpected":1}`,
		`{"source":"outbox.fanout","generation":1,"reason":"backlog","backlog":240000}`,
		`{"source":"outbox.fanout","generation":10,"reason":"backlog","backlog":0,"namespaces":["billing"]}`,
		`{"source":"outbox.fanout","generation":11,"reason":"backlog"}`, `{"source":"outbox.fanout","generation":0,"reason":"backlog"}`,
		`{"source":"outbox.fanout","generation":1,"reason":"boredom"}`, `{"source":"outbox.fanout","generation":1}`,
		`{"source":"outbox.fanout","generation":1,"reason":"backlog","backlog":-1}`, `{"source":"aws.events"}`,
		`{"generation":2}`, `{"backlog":5}`, `{"source":"outbox.fanout","generation":"1","reason":"backlog"}`,
		`{"detail-type":"Scheduled Event","detail":{"source":"outbox.fanout","generation":1,"reason":"backlog"}}`,
	) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ev, err := dispatchfn.ParseEvent(raw)
		if err != nil {
			eventfuzz.MustBeEventError(t, "dispatch", err)
			return
		}
		if ev.BatchSize < 0 || ev.BatchSize > config.MaxBatchSize || ev.MaxBatches < 0 || ev.MaxBatches > 1000 {
			t.Fatalf("accepted out of range: %+v from %q", ev, raw)
		}
		if ev.Worker() != (ev.Generation > 0) || ev.Generation > config.MaxFanoutGenerations || ev.Backlog < 0 ||
			(ev.Source != "" && ev.Reason != fanout.ReasonBacklog) {
			t.Fatalf("accepted a fan-out event out of range: %+v from %q", ev, raw)
		}
		for _, ns := range ev.Namespaces {
			if !outbox.NamePattern.MatchString(ns) {
				t.Fatalf("accepted namespace %q from %q", ns, raw)
			}
		}
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		again, err := dispatchfn.ParseEvent(b)
		if err != nil || !reflect.DeepEqual(normalise(again), normalise(ev)) {
			t.Fatalf("round trip of %s: %+v, %v; want %+v", b, again, err, ev)
		}
	})
}

// normalise treats an empty namespace list as none: both mean "all".
func normalise(ev dispatchfn.Event) dispatchfn.Event {
	if len(ev.Namespaces) == 0 {
		ev.Namespaces = nil
	}
	return ev
}
