package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-xray-sdk-go/instrumentation/awsv2"
	"github.com/aws/aws-xray-sdk-go/strategy/ctxmissing"
	"github.com/aws/aws-xray-sdk-go/strategy/exception"
	"github.com/aws/aws-xray-sdk-go/strategy/sampling"
	"github.com/aws/aws-xray-sdk-go/xray"
	"github.com/aws/aws-xray-sdk-go/xraylog"
	"github.com/aws/smithy-go/middleware"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/telemetry/redact"
)

// X-Ray's limits on annotations and the size we keep of a statement.
const (
	maxAnnotationLength = 1000
	maxStatementLength  = 4000
)

// xrayBackend records spans with the X-Ray SDK.
//
// Its configuration (emitter, error formatting, context-missing strategy)
// is carried in the context of the spans it starts rather than set on the
// SDK's globals: subsegments inherit it from their root, so two tracers —
// two tests, each with its own fake daemon — never see each other's spans.
type xrayBackend struct {
	config        *xray.Config
	inLambda      bool
	runtimeHeader func() string // the runtime's per-invocation trace header; nil: none
}

var _ backend = (*xrayBackend)(nil)

func newXRayBackend(cfg Config) (*xrayBackend, error) {
	addr, err := daemonUDPAddr(cfg.DaemonAddress)
	if err != nil {
		return nil, err
	}
	emitter, err := xray.NewDefaultEmitter(addr)
	if err != nil {
		return nil, fmt.Errorf("tracing: X-Ray emitter: %w", err)
	}
	formatting, err := exception.NewDefaultFormattingStrategy()
	if err != nil {
		return nil, fmt.Errorf("tracing: X-Ray error formatting: %w", err)
	}
	return &xrayBackend{
		config: &xray.Config{
			Emitter:                     emitter,
			ExceptionFormattingStrategy: redactingFormatter{formatting},
			// A call outside any span (an AWS call made with a context that
			// carries no trace) is simply not traced: no complaint, no panic.
			ContextMissingStrategy: ctxmissing.NewDefaultIgnoreErrorStrategy(),
			// Only traces begun outside Lambda consult it (on Lambda the
			// invocation's header decides): operator commands and local
			// runs, rare and always worth seeing.
			SamplingStrategy: sampleEverything{},
		},
		inLambda:      cfg.InLambda,
		runtimeHeader: cfg.TraceHeader,
	}, nil
}

// daemonUDPAddr parses AWS_XRAY_DAEMON_ADDRESS: "host:port", or
// "tcp:host:port udp:host:port" in either order; "" is the SDK's default.
func daemonUDPAddr(s string) (*net.UDPAddr, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		s = "127.0.0.1:2000"
	}
	fields := strings.Fields(s)
	for _, f := range fields {
		if rest, ok := strings.CutPrefix(f, "udp:"); ok {
			return resolveUDP(rest, s)
		}
	}
	if len(fields) == 1 && !strings.HasPrefix(fields[0], "tcp:") {
		return resolveUDP(fields[0], s)
	}
	return nil, fmt.Errorf("AWS_XRAY_DAEMON_ADDRESS=%q: want host:port or \"tcp:host:port udp:host:port\"", s)
}

func resolveUDP(hostPort, setting string) (*net.UDPAddr, error) {
	addr, err := net.ResolveUDPAddr("udp", hostPort)
	if err != nil {
		return nil, fmt.Errorf("AWS_XRAY_DAEMON_ADDRESS=%q: %w", setting, err)
	}
	return addr, nil
}

// prepare makes ctx ready for the SDK to begin a subsegment in and reports
// whether it holds a parent: a segment, or Lambda's trace header (from which
// the SDK builds the facade segment). When the runtime's context lost the
// header, the header in _X_AMZN_TRACE_ID is put back in.
func (b *xrayBackend) prepare(ctx context.Context) (context.Context, bool) {
	if xray.GetSegment(ctx) != nil {
		return ctx, true // subsegments inherit the root's configuration
	}
	ctx = context.WithValue(ctx, xray.RecorderContextKey{}, b.config)
	if h, _ := ctx.Value(xray.LambdaTraceHeaderKey).(string); h != "" {
		return ctx, true
	}
	if h := b.invocationHeader(); h != "" {
		return context.WithValue(ctx, xray.LambdaTraceHeaderKey, h), true
	}
	return ctx, false
}

func (b *xrayBackend) start(ctx context.Context, name string) (context.Context, spanBackend) {
	prepared, parent := b.prepare(ctx)
	var seg *xray.Segment
	switch {
	case parent:
		prepared, seg = xray.BeginSubsegment(prepared, name)
	case !b.inLambda:
		// A command-line tool or a local run: this span starts a trace.
		prepared, seg = xray.BeginSegment(prepared, name)
	}
	if seg == nil {
		return ctx, nil // on Lambda without a trace header: nothing to hang the span on
	}
	return prepared, xraySpan{seg}
}

func (b *xrayBackend) traceHeader(ctx context.Context) string {
	if seg := xray.GetSegment(ctx); seg != nil {
		seg.Lock()
		h := seg.DownstreamHeader()
		seg.Unlock()
		return h.String()
	}
	if h, _ := ctx.Value(xray.LambdaTraceHeaderKey).(string); h != "" {
		return h
	}
	return b.invocationHeader()
}

// invocationHeader is the trace header the Lambda runtime set for the
// current invocation, "" outside Lambda.
func (b *xrayBackend) invocationHeader() string {
	if !b.inLambda || b.runtimeHeader == nil {
		return ""
	}
	return b.runtimeHeader()
}

// xraySpan is a segment or subsegment.
type xraySpan struct{ seg *xray.Segment }

func (s xraySpan) setAttribute(key string, a attribute) {
	if redact.SensitiveKey(key) {
		return
	}
	var v any
	switch a.kind {
	case attributeString:
		v = truncate(redact.String(a.text), maxAnnotationLength)
	case attributeInt:
		v = int(a.int)
	case attributeFloat:
		v = a.float
	case attributeBool:
		v = a.bool
	default:
		return
	}
	_ = s.seg.AddAnnotation(annotationKey(key), v) // only fails for a type we never pass
}

func (s xraySpan) end(err error) {
	s.seg.Lock()
	ended := !s.seg.InProgress
	s.seg.Unlock()
	if ended {
		return // a second End would emit the segment twice
	}
	s.seg.Close(err)
}

// annotationKey keeps what X-Ray accepts in an annotation key: letters,
// digits and underscores.
func annotationKey(key string) string {
	clean := true
	for i := 0; i < len(key); i++ {
		if c := key[i]; !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			clean = false
			break
		}
	}
	if clean {
		return key
	}
	b := []byte(key)
	for i, c := range b {
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			b[i] = '_'
		}
	}
	return string(b)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// redactingFormatter masks credentials in every error text that reaches a
// segment: ours (Span.End) and the SDK's own (a failed AWS or HTTP call,
// whose text may hold a URL with a token).
type redactingFormatter struct{ exception.FormattingStrategy }

func (f redactingFormatter) ExceptionFromError(err error) exception.Exception {
	e := f.FormattingStrategy.ExceptionFromError(err)
	e.Message = redact.String(e.Message)
	return e
}

// sampleEverything samples every trace this process begins.
type sampleEverything struct{}

func (sampleEverything) ShouldTrace(*sampling.Request) *sampling.Decision {
	return &sampling.Decision{Sample: true}
}

// pgxSpanKey marks the subsegment a TraceQueryStart began, so that
// TraceQueryEnd closes that one and never the caller's span.
type pgxSpanKey struct{}

type xrayQueryTracer struct{ b *xrayBackend }

func (b *xrayBackend) queryTracer() pgx.QueryTracer { return xrayQueryTracer{b} }

func (q xrayQueryTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	prepared, parent := q.b.prepare(ctx)
	if !parent {
		return ctx
	}
	prepared, seg := xray.BeginSubsegment(prepared, "postgres")
	if seg == nil {
		return ctx
	}
	seg.Lock()
	seg.Namespace = "remote"
	sql := seg.GetSQL()
	sql.DatabaseType = "PostgreSQL"
	sql.DriverVersion = "pgx/v5"
	// The statement text only: data.Args is deliberately never read.
	sql.SanitizedQuery = truncate(data.SQL, maxStatementLength)
	if conn != nil {
		if pg := conn.PgConn(); pg != nil {
			sql.DatabaseVersion = pg.ParameterStatus("server_version")
			sql.User = pg.ParameterStatus("session_authorization")
			if nc := pg.Conn(); nc != nil {
				sql.URL = nc.RemoteAddr().String()
			}
		}
	}
	seg.Unlock()
	return context.WithValue(prepared, pgxSpanKey{}, seg)
}

func (q xrayQueryTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	seg, _ := ctx.Value(pgxSpanKey{}).(*xray.Segment)
	if seg == nil {
		return
	}
	if data.Err == nil {
		// "SELECT 500" says how many messages a claim took.
		_ = seg.AddMetadataToNamespace("postgres", "command_tag", data.CommandTag.String())
	}
	seg.Close(data.Err)
}

func (b *xrayBackend) instrumentAWS(cfg *aws.Config) {
	// Runs before the SDK's X-Ray middleware (both sit at the end of the
	// initialize step, this one first), so that its subsegments find the
	// recorder and, on Lambda, the trace header.
	cfg.APIOptions = append(cfg.APIOptions, func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("OutboxTraceContext",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				ctx, _ = b.prepare(ctx)
				return next.HandleInitialize(ctx, in)
			}), middleware.After)
	})
	awsv2.AWSV2Instrumentor(&cfg.APIOptions)
}

// callerTraceHeader carries a request's own X-Amzn-Trace-Id past the SDK's
// round tripper, which overwrites it.
type callerTraceHeader struct{}

func (b *xrayBackend) roundTripper(base http.RoundTripper) http.RoundTripper {
	return &tracingTransport{b: b, base: base, traced: xray.RoundTripper(restoreTraceHeader{base})}
}

// tracingTransport sends a request through the SDK's round tripper (a
// subsegment per request) when there is a trace to hang it on, and
// straight to base otherwise.
type tracingTransport struct {
	b      *xrayBackend
	base   http.RoundTripper
	traced http.RoundTripper
}

func (t *tracingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, parent := t.b.prepare(r.Context())
	if !parent {
		return t.base.RoundTrip(r)
	}
	if h := r.Header.Get(HTTPHeader); h != "" {
		ctx = context.WithValue(ctx, callerTraceHeader{}, h)
	}
	// A clone, because the SDK sets headers on the request it is given and
	// a RoundTripper must not change the caller's.
	return t.traced.RoundTrip(r.Clone(ctx))
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach base.
func (t *tracingTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// restoreTraceHeader puts the caller's X-Amzn-Trace-Id back: a plugin call
// carries the producer's trace, not the dispatcher's.
type restoreTraceHeader struct{ base http.RoundTripper }

func (r restoreTraceHeader) RoundTrip(req *http.Request) (*http.Response, error) {
	if h, _ := req.Context().Value(callerTraceHeader{}).(string); h != "" {
		req.Header.Set(HTTPHeader, h)
	}
	return r.base.RoundTrip(req)
}

// The SDK logs to stdout at info level by default, which on Lambda would
// mix its chatter ("Emitter using address…", "failed to begin subsegment…")
// into the JSON logs and the EMF stream. This package owns the SDK, so it
// replaces the logger as soon as it is imported.
func init() { xray.SetLogger(sdkLogger{}) }

// sdkErrorEvery bounds how often the SDK's errors reach the log: a daemon
// that is gone would otherwise fail every emit.
const sdkErrorEvery = time.Minute

var lastSDKError atomic.Int64 // unix nanoseconds

// sdkLogger drops the SDK's debug, info and warning messages and passes its
// errors to slog.Default() as warnings, at most one per sdkErrorEvery.
type sdkLogger struct{}

func (sdkLogger) Log(level xraylog.LogLevel, msg fmt.Stringer) {
	if level < xraylog.LogLevelError {
		return
	}
	now := time.Now().UnixNano()
	last := lastSDKError.Load()
	if now-last < int64(sdkErrorEvery) || !lastSDKError.CompareAndSwap(last, now) {
		return
	}
	slog.Default().Warn("tracing: X-Ray SDK error; spans may be lost (repeats suppressed for a minute)",
		"error", redact.String(msg.String()))
}
