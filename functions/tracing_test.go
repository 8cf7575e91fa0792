package functions_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// xrayDaemon stands in for the X-Ray daemon: a UDP listener that collects
// the segment documents the SDK sends ({"format":"json","version":1}\n{...}).
type xrayDaemon struct {
	conn *net.UDPConn
	mu   sync.Mutex
	docs []map[string]any
}

func startDaemon(t *testing.T) *xrayDaemon {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	d := &xrayDaemon{conn: conn}
	go func() {
		buf := make([]byte, 64*1024)
		for {
			n, _, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			_, body, ok := bytes.Cut(buf[:n], []byte("\n"))
			if !ok {
				continue
			}
			var doc map[string]any
			if json.Unmarshal(body, &doc) == nil {
				d.mu.Lock()
				d.docs = append(d.docs, doc)
				d.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return d
}

func (d *xrayDaemon) names(traceID string) map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]int{}
	var visit func(doc map[string]any)
	visit = func(doc map[string]any) {
		if name, ok := doc["name"].(string); ok {
			out[name]++
		}
		subs, _ := doc["subsegments"].([]any)
		for _, s := range subs {
			if m, ok := s.(map[string]any); ok {
				visit(m)
			}
		}
	}
	for _, doc := range d.docs {
		if doc["trace_id"] == traceID {
			visit(doc)
		}
	}
	return out
}

func TestDispatchIsTracedAndCarriesTheProducersTrace(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	sns := snsfake.New(t)
	eb := eventbridgefake.New(t)
	daemon := startDaemon(t)

	const producerTrace = "Root=1-67f0a1b2-0123456789abcdef01234567;Parent=1234567890abcdef;Sampled=1"
	for i, ns := range []string{"billing", "payments", "events"} {
		enqueue(t, db.Pool, 1, func(int) outbox.Message {
			return outbox.Message{Namespace: ns, Topic: "created", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
				DedupeKey: ns + "-1", TraceHeader: producerTrace}
		})
	}
	routes := fmt.Sprintf(`{"routes":[
	  {"match":{"namespace":"billing","topic":"*"},"target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET"}},
	  {"match":{"namespace":"payments","topic":"*"},"target":{"type":"sns","topic_arn":%q}},
	  {"match":{"namespace":"events","topic":"*"},"target":{"type":"eventbridge","event_bus":"default"}}]}`,
		snk.URL+"/hook", snsfake.TopicARN("payments"))
	fn := start(t, "dispatch",
		"OUTBOX_DATABASE_URL="+db.URL,
		"OUTBOX_FUNCTION_TIMEOUT=60s",
		"OUTBOX_ROUTES="+routes,
		"SINK_SECRET="+sinkSecret,
		"AWS_ENDPOINT_URL_SNS="+sns.URL(),
		"AWS_ENDPOINT_URL_EVENTBRIDGE="+eb.URL(),
		"AWS_XRAY_DAEMON_ADDRESS="+daemon.conn.LocalAddr().String(),
	)
	const invocationTrace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	fn.SetTraceHeader(invocationTrace)
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Delivered != 3 {
		t.Fatalf("summary %+v, want the 3 messages delivered\n%s", sum, fn.Stdout())
	}

	// The invocation's trace has a subsegment for each step.
	deadline := time.Now().Add(10 * time.Second)
	var names map[string]int
	for time.Now().Before(deadline) {
		names = daemon.names("1-5759e988-bd862e3fe1be46a994272793")
		if names["claim"] > 0 && names["publish"] >= 3 && names["complete"] > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for name, want := range map[string]int{"claim": 1, "publish": 3, "complete": 1, "postgres": 2} {
		if names[name] < want {
			t.Errorf("%d %q subsegments in the invocation's trace, want at least %d (got %v)", names[name], name, want, names)
		}
	}
	if names["SNS"] == 0 || names["EventBridge"] == 0 {
		t.Errorf("no subsegment for the AWS SDK calls (got %v)", names)
	}

	t.Logf("subsegments: %v", names)
	// The producer's trace reaches every target.
	ebEntries := eb.Received()
	if len(ebEntries) != 1 || ebEntries[0].TraceHeader != producerTrace {
		t.Errorf("EventBridge entry trace header %v, want the producer's", ebEntries)
	}
	snsEntries := sns.Received()
	if len(snsEntries) != 1 || snsEntries[0].Attributes["outbox.trace_header"].StringValue != producerTrace {
		t.Errorf("SNS message attributes %+v, want outbox.trace_header = the producer's", snsEntries)
	}
	snk.mu.Lock()
	got := snk.traceHeaders["billing-1"]
	snk.mu.Unlock()
	if got != producerTrace {
		t.Errorf("plugin request X-Amzn-Trace-Id %q, want the producer's %q", got, producerTrace)
	}
	if strings.Contains(fn.Stdout(), "failed to begin subsegment") {
		t.Errorf("the X-Ray SDK complained:\n%s", fn.Stdout())
	}
}

// With tracing off (the default outside Lambda's active tracing), nothing is
// sent to a daemon and nothing noisy is logged.
func TestTracingOffSendsNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	snk := newSink(t)
	daemon := startDaemon(t)
	enqueue(t, db.Pool, 5, usage)
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+snk.routes(), "AWS_XRAY_DAEMON_ADDRESS="+daemon.conn.LocalAddr().String())...)
	fn.SetTraceHeader(lambdatest.DefaultTraceHeader)
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	time.Sleep(200 * time.Millisecond)
	daemon.mu.Lock()
	n := len(daemon.docs)
	daemon.mu.Unlock()
	if sum.Delivered != 5 || n != 0 {
		t.Fatalf("delivered %d; %d segment documents sent with tracing off", sum.Delivered, n)
	}
	if strings.Contains(fn.Stdout(), "subsegment") || strings.Contains(fn.Stderr(), "subsegment") {
		t.Errorf("noisy tracing output with tracing off:\n%s%s", fn.Stdout(), fn.Stderr())
	}
}
