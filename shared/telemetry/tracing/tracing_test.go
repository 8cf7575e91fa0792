package tracing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// code is a named string type, as outboxtype.Code is.
type code string

func TestSpansAreSubsegmentsOfTheLambdaFacade(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	tr := lambdaTracer(t, d)
	inv := newInvocation()
	msgID := uuid.MustParse("0190a3c4-5d6e-7f80-9a0b-1c2d3e4f5a6b")

	ctx, dispatch := tr.Start(inv.ctx, "dispatch")
	if !dispatch.Recording() {
		t.Fatal("span not recording")
	}
	dispatch.SetAttribute("namespace", "billing")
	dispatch.SetAttribute("batch_size", 500)
	dispatch.SetAttribute("code", code("TARGET_5XX"))
	dispatch.SetAttribute("drained", true)
	dispatch.SetAttribute("lease", 90*time.Second)
	dispatch.SetAttribute("message-id", msgID)
	_, claim := tr.Start(ctx, "claim")
	claim.End(nil)
	dispatch.End(nil)

	doc := d.waitFor(t, "dispatch")
	checkUnderFacade(t, doc, inv)
	if doc.failed() {
		t.Errorf("a span ended without error is marked failed: %+v", doc)
	}
	want := map[string]any{
		"namespace": "billing", "batch_size": float64(500), "code": "TARGET_5XX",
		"drained": true, "lease": float64(90), "message_id": msgID.String(),
	}
	if fmt.Sprint(doc.Annotations) != fmt.Sprint(want) {
		t.Errorf("annotations %v, want %v", doc.Annotations, want)
	}
	if _, ok := doc.child("claim"); !ok {
		t.Errorf("the nested span is not a subsegment of its parent: %+v", doc.Subsegments)
	}
}

func TestAFailedSpanIsMarkedWithItsErrorMasked(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	tr := lambdaTracer(t, d)
	inv := newInvocation()

	_, span := tr.Start(inv.ctx, "connect")
	span.SetAttribute("lease_token", "tok-SECRET") // a sensitive key: dropped
	span.SetAttribute("dsn", "postgres://outbox:hunter2@db.internal/outbox")
	span.End(fmt.Errorf("lease: claim: failed to connect to postgres://outbox:hunter2@db.internal/outbox: %w", errBoom))
	span.End(nil) // a second End changes nothing and emits nothing

	doc := d.waitFor(t, "connect")
	checkUnderFacade(t, doc, inv)
	if !doc.failed() {
		t.Errorf("a span ended with an error is not marked failed: %+v", doc)
	}
	if msg := doc.errorMessages(); !strings.Contains(msg, "failed to connect to postgres://outbox:[REDACTED]@db.internal/outbox: boom") {
		t.Errorf("error message %q", msg)
	}
	if doc.Annotations["dsn"] != "postgres://outbox:[REDACTED]@db.internal/outbox" {
		t.Errorf("annotations %v", doc.Annotations)
	}
	time.Sleep(100 * time.Millisecond)
	raw := d.raw()
	for _, secret := range []string{"hunter2", "tok-SECRET", "lease_token"} {
		if strings.Contains(raw, secret) {
			t.Errorf("%q reached the daemon:\n%s", secret, raw)
		}
	}
	if n := d.count(); n != 1 {
		t.Errorf("%d documents, want 1 (End twice must not emit twice)", n)
	}
}

// The claim and complete calls appear as "postgres" subsegments with their
// statement, and no payload — a query parameter — ever reaches the daemon.
func TestQueriesAreSubsegmentsWithoutTheirParameters(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	tr := lambdaTracer(t, d)
	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tr.PgxTracer() })
	store := lease.NewStore(db.Pool)
	const cardNumber = "4111111111111111"
	payload := json.RawMessage(`{"card_number":"` + cardNumber + `","amount":4200}`)

	// The producer, inside its own traced invocation, stores its trace.
	producer := newInvocation()
	pctx, enqueue := tr.Start(producer.ctx, "enqueue")
	sent, err := outbox.Enqueue(pctx, db.Pool, outbox.Message{
		Namespace: "payments", Topic: "charge", Payload: payload, TraceHeader: tr.TraceHeader(pctx),
	})
	enqueue.End(err)
	if err != nil {
		t.Fatal(err)
	}
	enqueueDoc := d.waitFor(t, "enqueue")
	if q, ok := enqueueDoc.child("postgres"); !ok || !strings.Contains(fmt.Sprint(q.SQL["sanitized_query"]), "outbox.enqueue(") {
		t.Errorf("the enqueue query is not a subsegment of the producer's span: %+v", enqueueDoc.Subsegments)
	}

	// The dispatcher, in another invocation, claims and completes.
	inv := newInvocation()
	msgs, err := store.ClaimBatch(inv.ctx, lease.ClaimParams{WorkerID: "w-1", BatchSize: 10, Lease: time.Minute})
	if err != nil || len(msgs) != 1 || msgs[0].ID != sent.ID {
		t.Fatalf("claim: %v %v", msgs, err)
	}
	wantHeader := "Root=" + producer.traceID + ";Parent=" + enqueueDoc.ID + ";Sampled=1"
	if msgs[0].TraceHeader != wantHeader {
		t.Errorf("the claimed message carries the trace header %q, want the producer's %q", msgs[0].TraceHeader, wantHeader)
	}
	if _, err := store.CompleteBatch(inv.ctx, "w-1", []lease.Result{{ID: msgs[0].ID, LeaseToken: msgs[0].LeaseToken, Outcome: outboxtype.OutcomeDispatched}}); err != nil {
		t.Fatal(err)
	}
	// A failing query is marked failed.
	if _, err := db.Pool.Exec(inv.ctx, "SELECT 1/0"); err == nil {
		t.Fatal("SELECT 1/0 succeeded")
	}

	var claim, complete, failed segmentDoc
	deadline := time.Now().Add(5 * time.Second)
	for (claim.ID == "" || complete.ID == "" || failed.ID == "") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		d.mu.Lock()
		for _, e := range d.docs {
			if e.doc.Name != "postgres" || e.doc.TraceID != inv.traceID {
				continue
			}
			switch q := fmt.Sprint(e.doc.SQL["sanitized_query"]); {
			case strings.Contains(q, "outbox.claim_batch("):
				claim = e.doc
			case strings.Contains(q, "outbox.complete_batch("):
				complete = e.doc
			case q == "SELECT 1/0":
				failed = e.doc
			}
		}
		d.mu.Unlock()
	}
	for name, doc := range map[string]segmentDoc{"claim": claim, "complete": complete, "failing query": failed} {
		if doc.ID == "" {
			t.Fatalf("no postgres subsegment for the %s; received:\n%s", name, d.raw())
		}
		checkUnderFacade(t, doc, inv)
		if doc.Namespace != "remote" || doc.SQL["database_type"] != "PostgreSQL" || doc.SQL["user"] == "" || doc.SQL["database_version"] == "" {
			t.Errorf("%s: namespace %q, sql %v", name, doc.Namespace, doc.SQL)
		}
	}
	if claim.failed() || complete.failed() {
		t.Errorf("successful queries marked failed")
	}
	if !failed.failed() || !strings.Contains(failed.errorMessages(), "division by zero") {
		t.Errorf("failing query: fault %v, error %q", failed.Fault, failed.errorMessages())
	}
	if tag := claim.Metadata["postgres"]["command_tag"]; tag != "SELECT 1" {
		t.Errorf("claim command tag %v, want SELECT 1", tag)
	}

	raw := d.raw()
	for _, leak := range []string{cardNumber, "amount", "w-1"} {
		if strings.Contains(raw, leak) {
			t.Errorf("a query parameter (%q) reached the daemon", leak)
		}
	}
}

// eventBridgeServer speaks enough of EventBridge's JSON 1.1 protocol for
// PutEvents, and records the trace header of each request.
type eventBridgeServer struct {
	*httptest.Server
	mu      sync.Mutex
	headers []string
	fail    bool
}

func newEventBridgeServer(t *testing.T) *eventBridgeServer {
	s := &eventBridgeServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.headers = append(s.headers, r.Header.Get(tracing.HTTPHeader))
		fail := s.fail
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.Header().Set("X-Amzn-RequestId", "req-123")
		if r.Header.Get("X-Amz-Target") != "AWSEvents.PutEvents" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if fail {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"__type":"InternalException","message":"something broke"}`)
			return
		}
		io.WriteString(w, `{"Entries":[{"EventId":"e-1"}],"FailedEntryCount":0}`)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestAWSCallsAreSubsegments(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	tr := lambdaTracer(t, d)
	srv := newEventBridgeServer(t)
	cfg := aws.Config{
		Region:           "eu-west-1",
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""),
		HTTPClient:       srv.Client(),
		RetryMaxAttempts: 1,
	}
	tr.InstrumentAWS(&cfg)
	client := eventbridge.NewFromConfig(cfg, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(srv.URL) })
	put := &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
		Source: aws.String("outbox.billing"), DetailType: aws.String("usage"), Detail: aws.String(`{"n":1}`),
	}}}

	inv := newInvocation()
	if _, err := client.PutEvents(inv.ctx, put); err != nil {
		t.Fatal(err)
	}
	doc := d.waitFor(t, "EventBridge")
	checkUnderFacade(t, doc, inv)
	if doc.Namespace != "aws" || doc.AWS["operation"] != "PutEvents" || doc.AWS["region"] != "eu-west-1" || doc.HTTP.Response.Status != 200 || doc.failed() {
		t.Errorf("PutEvents subsegment: namespace %q, aws %v, status %d, failed %v", doc.Namespace, doc.AWS, doc.HTTP.Response.Status, doc.failed())
	}
	srv.mu.Lock()
	sentHeader := srv.headers[0]
	srv.fail = true
	srv.mu.Unlock()
	if !strings.HasPrefix(sentHeader, "Root="+inv.traceID+";Parent="+doc.ID+";") {
		t.Errorf("the request carried %q, want the subsegment's trace header", sentHeader)
	}

	failing := newInvocation()
	if _, err := client.PutEvents(failing.ctx, put); err == nil {
		t.Fatal("PutEvents against a failing server succeeded")
	}
	var failed segmentDoc
	for deadline := time.Now().Add(5 * time.Second); failed.ID == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		d.mu.Lock()
		for _, e := range d.docs {
			if e.doc.TraceID == failing.traceID {
				failed = e.doc
			}
		}
		d.mu.Unlock()
	}
	checkUnderFacade(t, failed, failing)
	if failed.Name != "EventBridge" || !failed.failed() || failed.HTTP.Response.Status != 500 {
		t.Errorf("failed call: name %q, failed %v, status %d", failed.Name, failed.failed(), failed.HTTP.Response.Status)
	}
	if strings.Contains(d.raw(), "wJalrXUtnFEMI") {
		t.Error("the secret access key reached the daemon")
	}
}

func TestHTTPCallsAreSubsegments(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	tr := lambdaTracer(t, d)
	var mu sync.Mutex
	var received []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received = append(received, r.Header.Get(tracing.HTTPHeader))
		mu.Unlock()
		if r.URL.Path == "/down" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	client := tr.HTTPClient(&http.Client{Timeout: 5 * time.Second})
	host := strings.TrimPrefix(srv.URL, "http://")

	post := func(ctx context.Context, path, traceHeader string) (*http.Request, int) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(`{"n":1}`))
		if traceHeader != "" {
			req.Header.Set(tracing.HTTPHeader, traceHeader)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return req, resp.StatusCode
	}

	inv := newInvocation()
	if _, status := post(inv.ctx, "/usage?access_token=tok-SECRET", ""); status != http.StatusNoContent {
		t.Fatalf("status %d", status)
	}
	doc := d.waitFor(t, host)
	checkUnderFacade(t, doc, inv)
	if doc.Namespace != "remote" || doc.HTTP.Request.Method != "POST" || doc.HTTP.Request.URL != srv.URL+"/usage" || doc.HTTP.Response.Status != 204 || doc.failed() {
		t.Errorf("HTTP subsegment: %+v", doc)
	}
	mu.Lock()
	got := received[0]
	mu.Unlock()
	if !strings.HasPrefix(got, "Root="+inv.traceID+";Parent="+doc.ID+";") {
		t.Errorf("the request carried %q, want the subsegment's header", got)
	}
	if strings.Contains(d.raw(), "tok-SECRET") {
		t.Error("the query string reached the daemon")
	}

	// A plugin call carries the producer's trace header, stored with the
	// message, and the caller's request is left as it was.
	producerHeader := "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	delivery := newInvocation()
	req, _ := post(delivery.ctx, "/usage", producerHeader)
	mu.Lock()
	got = received[1]
	mu.Unlock()
	if got != producerHeader {
		t.Errorf("the target received %q, want the producer's header %q", got, producerHeader)
	}
	if req.Header.Get(tracing.HTTPHeader) != producerHeader || len(req.Header) != 1 {
		t.Errorf("the caller's request was changed: %v", req.Header)
	}

	failing := newInvocation()
	if _, status := post(failing.ctx, "/down", ""); status != http.StatusServiceUnavailable {
		t.Fatalf("status %d", status)
	}
	var failed segmentDoc
	for deadline := time.Now().Add(5 * time.Second); failed.ID == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		d.mu.Lock()
		for _, e := range d.docs {
			if e.doc.TraceID == failing.traceID {
				failed = e.doc
			}
		}
		d.mu.Unlock()
	}
	checkUnderFacade(t, failed, failing)
	if !failed.Fault || failed.HTTP.Response.Status != 503 {
		t.Errorf("a 503 is not a fault: %+v", failed)
	}
}

func TestTraceHeader(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	tr := lambdaTracer(t, d)
	inv := newInvocation()

	// Before any span, the invocation's own header.
	if got := tr.TraceHeader(inv.ctx); got != inv.header {
		t.Errorf("TraceHeader of the invocation = %q, want %q", got, inv.header)
	}
	ctx, span := tr.Start(inv.ctx, "enqueue")
	header := tr.TraceHeader(ctx)
	span.End(nil)
	doc := d.waitFor(t, "enqueue")
	if want := "Root=" + inv.traceID + ";Parent=" + doc.ID + ";Sampled=1"; header != want {
		t.Errorf("TraceHeader in a span = %q, want %q", header, want)
	}
	if got := tr.TraceHeader(context.Background()); got != "" {
		t.Errorf("TraceHeader without a trace = %q, want empty", got)
	}
	if got := tracing.Disabled().TraceHeader(ctx); got != "" {
		t.Errorf("a disabled tracer's TraceHeader = %q, want empty", got)
	}
}

// With several invocations at a time the runtime does not set
// _X_AMZN_TRACE_ID; with one it does, and a handler that lost the context's
// header still gets its spans under the right trace.
func TestTheTraceHeaderFromTheRuntime(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	inv := newInvocation()
	tr := tracing.New(tracing.Config{Enabled: true, DaemonAddress: d.addr, InLambda: true,
		TraceHeader: func() string { return inv.header }})
	_, span := tr.Start(context.Background(), "reap")
	span.End(nil)
	checkUnderFacade(t, d.waitFor(t, "reap"), inv)
}

func TestOnLambdaWithoutATraceNothingIsRecorded(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	tr := lambdaTracer(t, d)
	ctx := context.Background()
	got, span := tr.Start(ctx, "orphan")
	if span.Recording() || got != ctx {
		t.Errorf("a span without a trace to join: recording %v", span.Recording())
	}
	span.SetAttribute("n", 1)
	span.End(errBoom)
	d.expectNothing(t, 200*time.Millisecond)
}

// A command-line tool (outboxctl) next to a daemon starts its own trace.
func TestOutsideLambdaAStartBeginsATrace(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	tr := tracing.New(tracing.Config{Enabled: true, DaemonAddress: d.addr})
	ctx, root := tr.Start(context.Background(), "outboxctl-replay")
	_, child := tr.Start(ctx, "replay_dead")
	child.End(nil)
	root.End(nil)
	doc := d.waitFor(t, "outboxctl-replay")
	if doc.Type != "" || doc.ParentID != "" || !strings.HasPrefix(doc.TraceID, "1-") {
		t.Errorf("not a root segment: type %q parent %q trace %q", doc.Type, doc.ParentID, doc.TraceID)
	}
	if _, ok := doc.child("replay_dead"); !ok {
		t.Errorf("the child span is missing: %+v", doc.Subsegments)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cfg     tracing.Config
		enabled bool
		reason  string
	}{
		{tracing.Config{Reason: "switched off"}, false, "disabled: switched off"},
		{tracing.Config{Enabled: true, Reason: "a daemon", DaemonAddress: "169.254.79.129:2000"}, true, "enabled (X-Ray): a daemon"},
		{tracing.Config{Enabled: true, DaemonAddress: "tcp:127.0.0.1:2000 udp:127.0.0.1:2001"}, true, "enabled"},
		{tracing.Config{Enabled: true}, true, "enabled"}, // the SDK's default daemon
		{tracing.Config{Enabled: true, DaemonAddress: "tcp:127.0.0.1:2000"}, false, "AWS_XRAY_DAEMON_ADDRESS="},
		{tracing.Config{Enabled: true, DaemonAddress: "localhost:notaport"}, false, "AWS_XRAY_DAEMON_ADDRESS="},
	}
	for _, tc := range cases {
		tr := tracing.New(tc.cfg)
		if tr.Enabled() != tc.enabled || !strings.Contains(tr.Reason(), tc.reason) {
			t.Errorf("%+v: enabled %v (%s); want %v (%s)", tc.cfg, tr.Enabled(), tr.Reason(), tc.enabled, tc.reason)
		}
	}
	var nilTracer *tracing.Tracer
	if nilTracer.Enabled() || tracing.Disabled().Enabled() {
		t.Error("a nil or Disabled tracer is enabled")
	}
}
