// Package logging writes JSON logs through log/slog with the keys Lambda
// users know from Powertools for AWS Lambda, so that the same Logs Insights
// queries work across every function:
//
//	{"timestamp":"2026-03-01T03:04:05.678Z","level":"ERROR","message":"publish failed",
//	 "service":"outbox-dispatch","cold_start":false,"function_name":"outbox-dispatch",
//	 "function_request_id":"c6af9ac6-…","xray_trace_id":"1-5759e988-bd862e3fe1be46a994272793",
//	 "message_id":"0190a3c4-…","code":"TARGET_5XX","error":"503 Service Unavailable"}
//
// Build one logger per cold start with [New] (level from [LevelFromEnv]),
// and one per invocation with [WithInvocation]:
//
//	var cold logging.ColdStart // package level in main
//	...
//	log := logging.WithInvocation(ctx, base, cold.Take())
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
	"os"
	"strconv"
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

// LevelFromEnv reads the log level: AWS_LAMBDA_LOG_LEVEL when set (Lambda's
// advanced logging controls drop JSON records below it anyway, so logging
// them would only cost), else OUTBOX_LOG_LEVEL (debug, info, warn or error;
// any case), else info. An unknown value is an error that names the
// variable, for the cold start to fail on.
func LevelFromEnv(getenv func(string) string) (slog.Level, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if v := getenv("AWS_LAMBDA_LOG_LEVEL"); v != "" {
		if l, ok := parseLevel(v, true); ok {
			return l, nil
		}
		return slog.LevelInfo, fmt.Errorf("logging: AWS_LAMBDA_LOG_LEVEL=%q: want TRACE, DEBUG, INFO, WARN, ERROR or FATAL", v)
	}
	if v := getenv("OUTBOX_LOG_LEVEL"); v != "" {
		if l, ok := parseLevel(v, false); ok {
			return l, nil
		}
		return slog.LevelInfo, fmt.Errorf("logging: OUTBOX_LOG_LEVEL=%q: want debug, info, warn or error", v)
	}
	return slog.LevelInfo, nil
}

func parseLevel(s string, lambdaLevels bool) (slog.Level, bool) {
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
// its initialisation — from the rest. Keep one per process (a package-level
// variable in main); its zero value is ready.
type ColdStart struct{ taken atomic.Bool }

// Take reports true to its first caller only, so exactly one invocation per
// process logs cold_start true. Under provisioned concurrency the
// initialisation happened before any request and Take never reports true,
// as in Powertools.
func (c *ColdStart) Take() bool {
	if c.taken.Swap(true) {
		return false
	}
	return os.Getenv("AWS_LAMBDA_INITIALIZATION_TYPE") != "provisioned-concurrency"
}

// lambdaTraceHeaderKey is where aws-lambda-go puts the invocation's
// X-Amzn-Trace-Id in the context (an untyped string key, by its contract).
const lambdaTraceHeaderKey = "x-amzn-trace-id"

// WithInvocation returns logger with the invocation's Powertools keys:
// cold_start, function_name (lambdacontext.FunctionName or
// AWS_LAMBDA_FUNCTION_NAME), function_request_id and function_arn (from the
// Lambda context in ctx), function_memory_size, and xray_trace_id (the Root
// of the trace header aws-lambda-go puts in ctx, or of _X_AMZN_TRACE_ID).
// Keys without a value — outside Lambda — are left out. Call it on the base
// logger once per invocation.
func WithInvocation(ctx context.Context, logger *slog.Logger, coldStart bool) *slog.Logger {
	attrs := make([]any, 0, 6)
	attrs = append(attrs, slog.Bool(KeyColdStart, coldStart))
	if name := functionName(); name != "" {
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
	if mb := memoryLimitMB(); mb > 0 {
		attrs = append(attrs, slog.Int(KeyFunctionMemory, mb))
	}
	if root := traceRoot(ctx); root != "" {
		attrs = append(attrs, slog.String(KeyXRayTraceID, root))
	}
	return logger.With(attrs...)
}

func functionName() string {
	if lambdacontext.FunctionName != "" {
		return lambdacontext.FunctionName
	}
	return os.Getenv("AWS_LAMBDA_FUNCTION_NAME")
}

func memoryLimitMB() int {
	if lambdacontext.MemoryLimitInMB > 0 {
		return lambdacontext.MemoryLimitInMB
	}
	mb, _ := strconv.Atoi(os.Getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"))
	return mb
}

// traceRoot is the Root field of the invocation's trace header
// ("Root=1-…;Parent=…;Sampled=1"), the X-Ray trace id.
func traceRoot(ctx context.Context) string {
	header, _ := ctx.Value(lambdaTraceHeaderKey).(string)
	if header == "" {
		header = os.Getenv("_X_AMZN_TRACE_ID")
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
