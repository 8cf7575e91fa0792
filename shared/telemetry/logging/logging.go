// Package logging writes JSON logs through log/slog with the keys Lambda
// users know from Powertools for AWS Lambda, so that the same Logs Insights
// queries work across every function:
//
//	{"timestamp":"2026-03-01T03:04:05.678Z","level":"ERROR","message":"publish failed",
//	 "service":"outbox-dispatch","cold_start":false,"function_name":"outbox-dispatch",
//	 "function_request_id":"c6af9ac6-…","xray_trace_id":"1-5759e988-bd862e3fe1be46a994272793",
//	 "message_id":"0190a3c4-…","code":"TARGET_5XX","error":"503 Service Unavailable"}
//
// Build one logger per cold start with [New] (the level parsed by
// [ParseLevel]), and one per invocation with [WithInvocation]:
//
//	cold := &logging.ColdStart{Provisioned: lambda.Provisioned} // once per process
//	...
//	log := logging.WithInvocation(ctx, base, lambda, cold.Take())
//
// # What never reaches the output
//
// The handler applies package redact to everything it writes:
//
//   - An attribute, group (slog.Group or Logger.WithGroup) or map/struct
//     member whose key is sensitive by [redact.SensitiveKey] — payload,
//     password, secret, token, authorization, api key, … — is dropped with
//     its whole value, at any depth.
//   - Credentials inside any text — the message, string attributes, error
//     texts, strings nested in structs and maps — are masked by
//     [redact.String]: URL passwords (postgres://user:…@host), password=…
//     pairs, secret JSON members, Bearer tokens.
//   - A []byte or json.RawMessage attribute is written as its length only:
//     raw bytes and raw JSON in a log are a payload more often than not.
//
// Message ids, codes, hosts, counts and the rest of an error text stay, so
// an operator can still tell what failed and why.
//
// # Levels
//
// Level names are Lambda's (TRACE, DEBUG, INFO, WARN, ERROR, FATAL), so that
// Lambda's advanced logging controls can filter the JSON records by level.
package logging

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/outboxkit/dispatcher/shared/telemetry/redact"
)

// The levels Lambda knows and slog does not.
const (
	// LevelTrace is below slog.LevelDebug (Lambda's TRACE).
	LevelTrace = slog.Level(-8)
	// LevelFatal is above slog.LevelError (Lambda's FATAL).
	LevelFatal = slog.Level(12)
)

// The Powertools keys this package writes.
const (
	KeyTimestamp         = "timestamp"
	KeyLevel             = "level"
	KeyMessage           = "message"
	KeyService           = "service"
	KeyColdStart         = "cold_start"
	KeyFunctionName      = "function_name"
	KeyFunctionRequestID = "function_request_id"
	KeyFunctionARN       = "function_arn"
	KeyFunctionMemory    = "function_memory_size"
	KeyXRayTraceID       = "xray_trace_id"
)

// timestampLayout is RFC 3339 with milliseconds, always in UTC ("…Z").
const timestampLayout = "2006-01-02T15:04:05.000Z07:00"

// New returns a JSON logger writing to w (os.Stdout on Lambda) at level and
// above, every record carrying service.
func New(w io.Writer, service string, level slog.Leveler) *slog.Logger {
	return slog.New(NewHandler(w, level)).With(slog.String(KeyService, service))
}

// NewHandler is the handler behind New, for callers that compose handlers.
func NewHandler(w io.Writer, level slog.Leveler) slog.Handler {
	return &handler{inner: slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: replaceAttr})}
}

// ParseLevel reads a level name in any case: debug, info, warn (or
// warning) or error, and with lambdaLevels also Lambda's trace and fatal.
func ParseLevel(s string, lambdaLevels bool) (slog.Level, bool) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "DEBUG":
		return slog.LevelDebug, true
	case "INFO":
		return slog.LevelInfo, true
	case "WARN", "WARNING":
		return slog.LevelWarn, true
	case "ERROR":
		return slog.LevelError, true
	case "TRACE":
		return LevelTrace, lambdaLevels
	case "FATAL":
		return LevelFatal, lambdaLevels
	}
	return 0, false
}

// levelName is the name Lambda's log-level filter understands.
func levelName(l slog.Level) string {
	switch {
	case l < slog.LevelDebug:
		return "TRACE"
	case l < slog.LevelInfo:
		return "DEBUG"
	case l < slog.LevelWarn:
		return "INFO"
	case l < slog.LevelError:
		return "WARN"
	case l < LevelFatal:
		return "ERROR"
	}
	return "FATAL"
}

// ColdStart tells the first invocation of a process — the one that paid for
// its initialisation — from the rest. Keep one per process; its zero value
// is ready.
type ColdStart struct {
	// Provisioned says the process was initialised under provisioned
	// concurrency, before any request: then no invocation is a cold start,
	// as in Powertools.
	Provisioned bool

	taken atomic.Bool
}

// Take reports true to its first caller only, so exactly one invocation per
// process logs cold_start true (none when Provisioned).
func (c *ColdStart) Take() bool {
	if c.taken.Swap(true) {
		return false
	}
	return !c.Provisioned
}

// Lambda describes the Lambda function a process runs as, as the runtime's
// variables describe it (the config package reads them at cold start); its
// zero value is a process outside Lambda.
type Lambda struct {
	// FunctionName is the function's name.
	FunctionName string
	// MemoryMB is the function's memory size.
	MemoryMB int
	// Provisioned says the execution environment was initialised under
	// provisioned concurrency (see ColdStart).
	Provisioned bool
	// TraceHeader returns the trace header the runtime sets for the
	// current invocation, for a handler whose context lost it; nil when
	// there is none.
	TraceHeader func() string
}

// lambdaTraceHeaderKey is where aws-lambda-go puts the invocation's
// X-Amzn-Trace-Id in the context (an untyped string key, by its contract).
const lambdaTraceHeaderKey = "x-amzn-trace-id"

// WithInvocation returns logger with the invocation's Powertools keys:
// cold_start, function_name and function_memory_size (from lambda),
// function_request_id and function_arn (from the Lambda context in ctx),
// and xray_trace_id (the Root of the trace header aws-lambda-go puts in
// ctx, or of lambda.TraceHeader). Keys without a value — outside Lambda —
// are left out. Call it on the base logger once per invocation.
func WithInvocation(ctx context.Context, logger *slog.Logger, lambda Lambda, coldStart bool) *slog.Logger {
	attrs := make([]any, 0, 6)
	attrs = append(attrs, slog.Bool(KeyColdStart, coldStart))
	if name := lambda.FunctionName; name != "" {
		attrs = append(attrs, slog.String(KeyFunctionName, name))
	}
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		if lc.AwsRequestID != "" {
			attrs = append(attrs, slog.String(KeyFunctionRequestID, lc.AwsRequestID))
		}
		if lc.InvokedFunctionArn != "" {
			attrs = append(attrs, slog.String(KeyFunctionARN, lc.InvokedFunctionArn))
		}
	}
	if mb := lambda.MemoryMB; mb > 0 {
		attrs = append(attrs, slog.Int(KeyFunctionMemory, mb))
	}
	if root := traceRoot(ctx, lambda); root != "" {
		attrs = append(attrs, slog.String(KeyXRayTraceID, root))
	}
	return logger.With(attrs...)
}

// traceRoot is the Root field of the invocation's trace header
// ("Root=1-…;Parent=…;Sampled=1"), the X-Ray trace id.
func traceRoot(ctx context.Context, lambda Lambda) string {
	header, _ := ctx.Value(lambdaTraceHeaderKey).(string)
	if header == "" && lambda.TraceHeader != nil {
		header = lambda.TraceHeader()
	}
	for field := range strings.SplitSeq(header, ";") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(field), "Root="); ok {
			return v
		}
	}
	return ""
}

// RedactError is err's text with credentials masked, "" for nil: for error
// texts that leave the process other than through this package's handler,
// which masks them by itself. See [redact.Error].
func RedactError(err error) string { return redact.Error(err) }

// replaceAttr renames slog's built-in keys to the Powertools ones and masks
// credentials in values. It never drops an attribute: slog's JSONHandler
// writes invalid JSON when ReplaceAttr empties a group (see golang/go#62512),
// so sensitive keys are pruned earlier, by handler.
func replaceAttr(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 {
		switch a.Key {
		case slog.TimeKey:
			if a.Value.Kind() == slog.KindTime {
				return slog.String(KeyTimestamp, a.Value.Time().UTC().Format(timestampLayout))
			}
		case slog.LevelKey:
			if l, ok := a.Value.Any().(slog.Level); ok {
				return slog.String(KeyLevel, levelName(l))
			}
		case slog.MessageKey:
			return slog.String(KeyMessage, redact.String(a.Value.String()))
		}
	}
	a.Value = cleanValue(a.Value)
	return a
}

// cleanValue masks credentials in a leaf value.
func cleanValue(v slog.Value) slog.Value {
	switch v.Kind() {
	case slog.KindString:
		return slog.StringValue(redact.String(v.String()))
	case slog.KindAny:
		return cleanAny(v.Any())
	}
	return v
}

func cleanAny(x any) slog.Value {
	switch v := x.(type) {
	case nil:
		return slog.AnyValue(nil)
	case error:
		return slog.StringValue(redact.Error(v))
	case slog.Level:
		return slog.StringValue(levelName(v))
	case []byte:
		return slog.StringValue(fmt.Sprintf("[%d bytes]", len(v)))
	case json.RawMessage:
		// Raw JSON is what payloads are made of in this project.
		return slog.StringValue(fmt.Sprintf("[%d bytes of JSON]", len(v)))
	}
	return slog.AnyValue(cleanTree(x))
}
