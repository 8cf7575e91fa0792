package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-xray-sdk-go/xray"

	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
)

// fakeDaemon stands in for the X-Ray daemon: a UDP listener that receives
// the segment documents the SDK emits, exactly as it sends them.
type fakeDaemon struct {
	addr string
	mu   sync.Mutex
	docs []emitted
	// arrived is signalled (without blocking) on every datagram.
	arrived chan struct{}
}

// emitted is one datagram: the raw bytes and the decoded document.
type emitted struct {
	raw []byte
	doc segmentDoc
}

// segmentDoc is the part of the X-Ray segment document the tests read.
type segmentDoc struct {
	Name        string                    `json:"name"`
	ID          string                    `json:"id"`
	TraceID     string                    `json:"trace_id"`
	ParentID    string                    `json:"parent_id"`
	Type        string                    `json:"type"`
	Namespace   string                    `json:"namespace"`
	Fault       bool                      `json:"fault"`
	Error       bool                      `json:"error"`
	Throttle    bool                      `json:"throttle"`
	InProgress  bool                      `json:"in_progress"`
	Annotations map[string]any            `json:"annotations"`
	Metadata    map[string]map[string]any `json:"metadata"`
	SQL         map[string]any            `json:"sql"`
	AWS         map[string]any            `json:"aws"`
	HTTP        struct {
		Request struct {
			Method string `json:"method"`
			URL    string `json:"url"`
		} `json:"request"`
		Response struct {
			Status int `json:"status"`
		} `json:"response"`
	} `json:"http"`
	Cause *struct {
		Exceptions []struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"exceptions"`
	} `json:"cause"`
	Subsegments []segmentDoc `json:"subsegments"`
}

func (d segmentDoc) failed() bool { return d.Fault || d.Error }

func (d segmentDoc) errorMessages() string {
	if d.Cause == nil {
		return ""
	}
	var msgs []string
	for _, e := range d.Cause.Exceptions {
		msgs = append(msgs, e.Message)
	}
	return strings.Join(msgs, "; ")
}

// child finds a nested subsegment by name, at any depth.
func (d segmentDoc) child(name string) (segmentDoc, bool) {
	for _, s := range d.Subsegments {
		if s.Name == name {
			return s, true
		}
		if c, ok := s.child(name); ok {
			return c, true
		}
	}
	return segmentDoc{}, false
}

// xrayHeader is the first line of every datagram the SDK sends.
const xrayHeader = `{"format": "json", "version": 1}` + "\n"

func startDaemon(t testing.TB) *fakeDaemon {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDaemon{addr: conn.LocalAddr().String(), arrived: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64*1024)
		for {
			n, _, err := conn.ReadFromUDP(buf)
			if err != nil {
				return // closed
			}
			raw := bytes.Clone(buf[:n])
			body, ok := bytes.CutPrefix(raw, []byte(xrayHeader))
			if !ok {
				t.Errorf("datagram without the X-Ray header: %q", raw)
				continue
			}
			var doc segmentDoc
			if err := json.Unmarshal(body, &doc); err != nil {
				t.Errorf("datagram is not a segment document: %v: %s", err, body)
				continue
			}
			d.mu.Lock()
			d.docs = append(d.docs, emitted{raw: raw, doc: doc})
			d.mu.Unlock()
			select {
			case d.arrived <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return d
}

// waitFor returns the first document named name, waiting up to a minute
// (a ceiling for a broken emitter, not a measure of a slow machine).
func (d *fakeDaemon) waitFor(t testing.TB, name string) segmentDoc {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		d.mu.Lock()
		for _, e := range d.docs {
			if e.doc.Name == name {
				d.mu.Unlock()
				return e.doc
			}
		}
		var names []string
		for _, e := range d.docs {
			names = append(names, e.doc.Name)
		}
		d.mu.Unlock()
		select {
		case <-d.arrived:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the daemon received no segment named %q (got %v)", name, names)
		}
	}
}

// raw is everything the daemon received, for searching.
func (d *fakeDaemon) raw() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	for _, e := range d.docs {
		b.Write(e.raw)
		b.WriteByte('\n')
	}
	return b.String()
}

func (d *fakeDaemon) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.docs)
}

// expectNothing fails if anything arrives within wait.
func (d *fakeDaemon) expectNothing(t testing.TB, wait time.Duration) {
	t.Helper()
	time.Sleep(wait)
	if n := d.count(); n != 0 {
		t.Fatalf("the daemon received %d documents, want none:\n%s", n, d.raw())
	}
}

// lambdaTracer is a tracer as on Lambda with active tracing, emitting to d.
func lambdaTracer(t testing.TB, d *fakeDaemon) *tracing.Tracer {
	t.Helper()
	tr := tracing.New(tracing.Config{Enabled: true, Reason: "a test", DaemonAddress: d.addr, InLambda: true})
	if !tr.Enabled() {
		t.Fatalf("tracer disabled: %s", tr.Reason())
	}
	return tr
}

// invocation is the context aws-lambda-go hands a handler when the function
// is traced: the trace header under "x-amzn-trace-id". The SDK builds the
// facade segment (Lambda's own) from it, as it does on Lambda.
type invocation struct {
	ctx      context.Context
	traceID  string
	parentID string
	header   string
}

func newInvocation() invocation {
	inv := invocation{traceID: xray.NewTraceID(), parentID: xray.NewSegmentID()}
	inv.header = "Root=" + inv.traceID + ";Parent=" + inv.parentID + ";Sampled=1"
	//nolint:staticcheck // the runtime's own key, an untyped string (aws-lambda-go/lambda/invoke_loop.go)
	inv.ctx = context.WithValue(context.Background(), "x-amzn-trace-id", inv.header)
	return inv
}

// checkUnderFacade asserts doc is a subsegment emitted under inv's facade.
func checkUnderFacade(t testing.TB, doc segmentDoc, inv invocation) {
	t.Helper()
	if doc.Type != "subsegment" || doc.TraceID != inv.traceID || doc.ParentID != inv.parentID {
		t.Errorf("%s: type %q trace %q parent %q; want a subsegment of %s/%s", doc.Name, doc.Type, doc.TraceID, doc.ParentID, inv.traceID, inv.parentID)
	}
	if doc.InProgress {
		t.Errorf("%s emitted in progress", doc.Name)
	}
}

var errBoom = errors.New("boom")
