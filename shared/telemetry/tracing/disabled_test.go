package tracing_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// disabledTracer is disabled although a daemon is configured: the daemon
// shows whether anything is emitted anyway.
func disabledTracer(t testing.TB, d *fakeDaemon) *tracing.Tracer {
	t.Helper()
	tr := tracing.New(tracing.Config{Reason: "turned off", DaemonAddress: d.addr, InLambda: true})
	if tr.Enabled() {
		t.Fatal("a tracer built disabled is enabled")
	}
	return tr
}

func TestDisabledTracerEmitsNothingAndChangesNothing(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	tr := disabledTracer(t, d)
	inv := newInvocation() // even inside a traced invocation

	ctx, span := tr.Start(inv.ctx, "dispatch")
	if ctx != inv.ctx || span.Recording() {
		t.Error("a disabled Start changed the context or returned a recording span")
	}
	span.SetAttribute("namespace", "billing")
	span.End(errBoom)

	db := pgtest.NewWithConfig(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tr.PgxTracer() })
	if _, err := db.Pool.Exec(inv.ctx, "SELECT $1::text", "payload"); err != nil {
		t.Fatal(err)
	}

	cfg := aws.Config{Region: "eu-west-1"}
	tr.InstrumentAWS(&cfg)
	if len(cfg.APIOptions) != 0 {
		t.Errorf("a disabled InstrumentAWS added %d API options", len(cfg.APIOptions))
	}

	c := &http.Client{Timeout: time.Second}
	if tr.HTTPClient(c) != c {
		t.Error("a disabled HTTPClient did not return the client itself")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	req, _ := http.NewRequestWithContext(inv.ctx, http.MethodGet, srv.URL, nil)
	resp, err := tr.HTTPClient(srv.Client()).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	if h := tr.TraceHeader(inv.ctx); h != "" {
		t.Errorf("a disabled TraceHeader = %q", h)
	}
	d.expectNothing(t, 300*time.Millisecond)
}

// The disabled path must cost nothing on the hot path: no allocation for
// Start, SetAttribute (whatever the value), End, TraceHeader and the query
// tracer's hooks. A nil *Tracer behaves the same.
func TestDisabledTracerAllocatesNothing(t *testing.T) {
	d := startDaemon(t)
	ctx := newInvocation().ctx
	// Values the compiler cannot make constant, so that boxing them for
	// SetAttribute would allocate if they escaped.
	batch := len(os.Args) * 1000
	namespace := string([]byte("billing"))
	msgID := uuid.New()
	failure := errors.New("boom")
	type code string
	c := code(namespace)

	var nilTracer *tracing.Tracer
	for name, tr := range map[string]*tracing.Tracer{"disabled": disabledTracer(t, d), "nil": nilTracer} {
		q := tr.PgxTracer()
		allocs := testing.AllocsPerRun(1000, func() {
			sctx, span := tr.Start(ctx, "publish")
			span.SetAttribute("batch_size", batch)
			span.SetAttribute("namespace", namespace)
			span.SetAttribute("message_id", msgID)
			span.SetAttribute("code", c)
			span.SetAttribute("lease", time.Duration(batch))
			_ = tr.TraceHeader(sctx)
			qctx := q.TraceQueryStart(sctx, nil, pgx.TraceQueryStartData{SQL: "SELECT 1"})
			q.TraceQueryEnd(qctx, nil, pgx.TraceQueryEndData{})
			span.End(failure)
		})
		if allocs != 0 {
			t.Errorf("%s tracer: %.1f allocations per span, want 0", name, allocs)
		}
	}
}

func BenchmarkDisabledSpan(b *testing.B) {
	tr := tracing.Disabled()
	ctx := context.Background()
	batch := len(os.Args) * 1000
	b.ReportAllocs()
	for b.Loop() {
		_, span := tr.Start(ctx, "publish")
		span.SetAttribute("batch_size", batch)
		span.SetAttribute("namespace", "billing")
		span.End(nil)
	}
}

func BenchmarkDisabledQueryTracer(b *testing.B) {
	q := tracing.Disabled().PgxTracer()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		qctx := q.TraceQueryStart(ctx, nil, pgx.TraceQueryStartData{SQL: "SELECT 1"})
		q.TraceQueryEnd(qctx, nil, pgx.TraceQueryEndData{})
	}
}

// For comparison: the same span recorded and emitted under a Lambda facade.
func BenchmarkEnabledSpan(b *testing.B) {
	d := startDaemon(b)
	tr := lambdaTracer(b, d)
	ctx := newInvocation().ctx
	batch := len(os.Args) * 1000
	b.ReportAllocs()
	for b.Loop() {
		_, span := tr.Start(ctx, "publish")
		span.SetAttribute("batch_size", batch)
		span.SetAttribute("namespace", "billing")
		span.End(nil)
	}
}
