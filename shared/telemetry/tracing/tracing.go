// Package tracing is the project's one door to distributed tracing. Callers
// see a [Tracer], a [Span] and four hooks — [Tracer.PgxTracer],
// [Tracer.InstrumentAWS], [Tracer.HTTPClient] and [Tracer.TraceHeader] — and
// nothing of the backend behind them. Today that backend is the AWS X-Ray
// SDK for Go (github.com/aws/aws-xray-sdk-go); AWS ends its support on
// 2027-02-25, and an OpenTelemetry backend (the ADOT Lambda layer, or an
// OTLP exporter) can replace it here without a change to any caller.
//
// # Use
//
// In main, once per cold start, with the Config the config package read:
//
//	tracer := tracing.New(cfg.Tracing)
//	poolConfig.ConnConfig.Tracer = tracer.PgxTracer() // a subsegment per query
//	tracer.InstrumentAWS(&awsConfig)                  // a subsegment per SNS, EventBridge, Lambda call
//	webhookClient := tracer.HTTPClient(&http.Client{Timeout: 5 * time.Second})
//	logger.Info("tracing", "enabled", tracer.Enabled(), "reason", tracer.Reason())
//
// In the handler, around each step worth seeing on the timeline:
//
//	ctx, span := tracer.Start(ctx, "publish")
//	span.SetAttribute("namespace", route.Namespace)
//	span.SetAttribute("batch_size", len(msgs))
//	err := publish(ctx, msgs)
//	span.End(err)
//
// and at enqueue, to store the producer's trace with the message:
//
//	msg.TraceHeader = tracer.TraceHeader(ctx)
//
// # Selection
//
// Whether to trace is decided by the config package from the environment
// (OUTBOX_TRACING, and the X-Ray variables AWS_XRAY_SDK_DISABLED,
// AWS_XRAY_DAEMON_ADDRESS and _X_AMZN_TRACE_ID; see its documentation) and
// handed to [New] with the reason, for the cold-start log line. Local runs
// and tests get the disabled tracer.
//
// # On Lambda
//
// Lambda records the invocation's segment itself and hands the function
// its trace header (the runtime puts it in the context under
// "x-amzn-trace-id" and, with one invocation at a time, in _X_AMZN_TRACE_ID).
// The X-Ray SDK turns that header into a facade segment, and spans become
// its subsegments: they appear under the function's segment in the X-Ray
// console. Outside Lambda, a Start with no span in the context begins a new
// trace (a segment) instead, always sampled: such traces are operator
// commands and local runs.
//
// # Disabled
//
// The disabled tracer — and a nil *Tracer — does nothing, allocates nothing
// and logs nothing: Start returns the context unchanged and a Span whose
// methods return at once; PgxTracer returns a tracer whose hooks are empty;
// InstrumentAWS and HTTPClient change nothing. The X-Ray SDK is never
// called, so its "failed to begin subsegment" complaints cannot occur. The
// SDK's own logger is replaced when this package is imported: its debug and
// info chatter is dropped, and its errors reach slog.Default() as warnings,
// at most one a minute.
//
// # What a trace never holds
//
// SQL parameters (they carry payloads) are never read. Attribute keys that
// name secrets or payloads are dropped, and error texts and string
// attributes are masked, by the rules of package redact.
package tracing

import (
	"context"
	"net/http"
	"reflect"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// HTTPHeader is the header that carries a trace across HTTP (and the
// header value TraceHeader returns).
const HTTPHeader = "X-Amzn-Trace-Id"

// Tracer starts spans and instruments clients. Build it once per process
// with New. A nil *Tracer is a valid disabled tracer.
type Tracer struct {
	backend backend // nil when disabled
	reason  string
}

// backend is what a tracing implementation provides; xrayBackend is the
// one there is. An OpenTelemetry backend would implement the same five
// methods.
type backend interface {
	start(ctx context.Context, name string) (context.Context, spanBackend)
	traceHeader(ctx context.Context) string
	queryTracer() pgx.QueryTracer
	instrumentAWS(cfg *aws.Config)
	roundTripper(base http.RoundTripper) http.RoundTripper
}

// spanBackend is one open span of a backend.
type spanBackend interface {
	setAttribute(key string, value attribute)
	end(err error)
}

// Config is what New builds a tracer from.
type Config struct {
	// Enabled records spans; Reason says why they are recorded or not.
	Enabled bool
	Reason  string
	// DaemonAddress is the X-Ray daemon's address in the form of
	// AWS_XRAY_DAEMON_ADDRESS: "host:port", or "tcp:host:port
	// udp:host:port"; "" is the SDK's default, 127.0.0.1:2000.
	DaemonAddress string
	// InLambda says the process is a Lambda function: spans join the
	// invocation's trace, and none starts a trace of its own.
	InLambda bool
	// TraceHeader returns the trace header the Lambda runtime sets for the
	// current invocation (in _X_AMZN_TRACE_ID), for a handler whose context
	// lost it; nil when there is none.
	TraceHeader func() string
}

// New returns the tracer cfg asks for. It never fails: a configuration it
// cannot use gives the disabled tracer, and Reason says why.
func New(cfg Config) *Tracer {
	if !cfg.Enabled {
		return &Tracer{reason: "disabled: " + cfg.Reason}
	}
	b, err := newXRayBackend(cfg)
	if err != nil {
		return &Tracer{reason: "disabled: " + err.Error()}
	}
	return &Tracer{backend: b, reason: "enabled (X-Ray): " + cfg.Reason}
}

// Disabled returns a tracer that does nothing, for tests and tools.
func Disabled() *Tracer { return &Tracer{reason: "disabled by the caller"} }

// Enabled reports whether spans are recorded.
func (t *Tracer) Enabled() bool { return t != nil && t.backend != nil }

// Reason says why the tracer is enabled or disabled, for the cold-start
// log line.
func (t *Tracer) Reason() string {
	if t == nil {
		return "disabled: nil tracer"
	}
	return t.reason
}

// Start begins a span named name as a child of the span in ctx (or, on
// Lambda, of the invocation's segment) and returns a context carrying it.
// End the span exactly once. Disabled, it returns ctx itself and a no-op
// Span, and costs a nil check.
func (t *Tracer) Start(ctx context.Context, name string) (context.Context, Span) {
	if t == nil || t.backend == nil {
		return ctx, Span{}
	}
	ctx, s := t.backend.start(ctx, name)
	return ctx, Span{impl: s}
}

// TraceHeader returns the trace header of the span in ctx
// ("Root=1-…;Parent=…;Sampled=1"), for a producer to store with the message
// at enqueue and for the dispatcher to pass on at delivery. It is "" when
// tracing is disabled or there is no trace in ctx.
func (t *Tracer) TraceHeader(ctx context.Context) string {
	if t == nil || t.backend == nil {
		return ""
	}
	return t.backend.traceHeader(ctx)
}

// PgxTracer returns a pgx query tracer that records each query as a
// subsegment named "postgres" holding the statement text — never its
// parameters, which carry payloads. Disabled, its hooks are empty (it is
// never nil, so it composes with other tracers).
func (t *Tracer) PgxTracer() pgx.QueryTracer {
	if t == nil || t.backend == nil {
		return noopQueryTracer{}
	}
	return t.backend.queryTracer()
}

// InstrumentAWS adds a subsegment for every call of every client built from
// cfg (SNS, EventBridge, Lambda, Secrets Manager…), retries included. Call it
// before building the clients. Disabled, it leaves cfg alone.
func (t *Tracer) InstrumentAWS(cfg *aws.Config) {
	if t == nil || t.backend == nil || cfg == nil {
		return
	}
	t.backend.instrumentAWS(cfg)
}

// HTTPClient returns a copy of c (nil: a zero http.Client) whose requests
// each get a subsegment with the method, URL (without query) and status. A
// request that already carries an X-Amzn-Trace-Id header — the producer's,
// stored with the message — keeps it; others get the current span's.
// Disabled, it returns c itself.
func (t *Tracer) HTTPClient(c *http.Client) *http.Client {
	if c == nil {
		c = &http.Client{}
	}
	if t == nil || t.backend == nil {
		return c
	}
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	traced := *c
	traced.Transport = t.backend.roundTripper(base)
	return &traced
}

// Span is one timed operation. The zero Span (what a disabled tracer
// returns) is valid and does nothing.
type Span struct {
	impl spanBackend
}

// Recording reports whether the span is recorded, so that a caller can skip
// computing an expensive attribute nobody will see.
func (s Span) Recording() bool { return s.impl != nil }

// SetAttribute records key=value on the span (an X-Ray annotation: indexed,
// searchable with filter expressions such as annotation.namespace =
// "billing"). value is a string, a bool, an integer or a float (or a named
// type of one, such as a code), a time.Duration (recorded in seconds), a
// time.Time or a uuid.UUID; anything else is recorded as its type's name —
// format it first. Converting it costs no allocation when the span is not
// recording. Keys that name secrets or payloads are dropped and credentials
// in strings masked (package redact).
func (s Span) SetAttribute(key string, value any) {
	if s.impl == nil {
		return
	}
	s.impl.setAttribute(key, attributeOf(value))
}

// End ends the span; a non-nil err marks it failed (a fault) with err's
// text, credentials masked. Only the first End counts.
func (s Span) End(err error) {
	if s.impl == nil {
		return
	}
	s.impl.end(err)
}

// attribute is an attribute value reduced to what trace backends store.
type attribute struct {
	kind  attributeKind
	text  string
	int   int64
	float float64
	bool  bool
}

type attributeKind uint8

const (
	attributeString attributeKind = iota + 1
	attributeInt
	attributeFloat
	attributeBool
)

// attributeOf converts value without letting it escape: the conversions
// only copy out what the interface holds (never pass it on, never call one
// of its methods), so a caller's value is not moved to the heap for a span
// that may not even record. Keep it that way; TestDisabledTracerAllocatesNothing
// guards it.
func attributeOf(value any) attribute {
	switch v := value.(type) {
	case string:
		return attribute{kind: attributeString, text: v}
	case bool:
		return attribute{kind: attributeBool, bool: v}
	case int:
		return attribute{kind: attributeInt, int: int64(v)}
	case int64:
		return attribute{kind: attributeInt, int: v}
	case int32:
		return attribute{kind: attributeInt, int: int64(v)}
	case float64:
		return attribute{kind: attributeFloat, float: v}
	case time.Duration:
		return attribute{kind: attributeFloat, float: v.Seconds()}
	case time.Time:
		return attribute{kind: attributeString, text: v.UTC().Format(time.RFC3339Nano)}
	case uuid.UUID:
		return attribute{kind: attributeString, text: v.String()}
	}
	// Named types (an outboxtype.Code, an outboxtype.Outcome) and the other sizes.
	rv := reflect.ValueOf(value)
	switch rv.Kind() {
	case reflect.String:
		return attribute{kind: attributeString, text: rv.String()}
	case reflect.Bool:
		return attribute{kind: attributeBool, bool: rv.Bool()}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return attribute{kind: attributeInt, int: rv.Int()}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return attribute{kind: attributeInt, int: int64(rv.Uint())}
	case reflect.Float32, reflect.Float64:
		return attribute{kind: attributeFloat, float: rv.Float()}
	case reflect.Invalid:
		return attribute{kind: attributeString, text: "<nil>"}
	}
	return attribute{kind: attributeString, text: "<" + rv.Type().String() + ">"}
}

// noopQueryTracer is the disabled PgxTracer.
type noopQueryTracer struct{}

func (noopQueryTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (noopQueryTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
