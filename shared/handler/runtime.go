package handler

import (
	"context"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
	"github.com/outboxkit/dispatcher/shared/telemetry/logging"
	"github.com/outboxkit/dispatcher/shared/telemetry/tracing"
)

// Runtime is what every handler shares: the base logger, the cold-start
// flag, the tracer and where metrics go. Build one per process.
type Runtime struct {
	// Function names the function in logs ("service") and metrics.
	Function string
	// Log is the base JSON logger.
	Log *slog.Logger
	// Tracer may be nil (tracing off).
	Tracer *tracing.Tracer
	// MetricsNamespace is the CloudWatch namespace (OUTBOX_METRICS_NAMESPACE).
	MetricsNamespace string
	// MetricsOut receives the Embedded Metric Format documents (stdout in
	// Lambda, where CloudWatch Logs extracts them).
	MetricsOut io.Writer
	// Lambda is what the Lambda runtime says of the function (zero
	// outside Lambda).
	Lambda logging.Lambda

	cold logging.ColdStart
}

// Begin starts one invocation: its logger, carrying the Powertools
// keys, and whether it is the process's cold start.
func (rt *Runtime) Begin(ctx context.Context) (*slog.Logger, bool) {
	cold := rt.cold.Take()
	base := rt.Log
	if base == nil {
		base = slog.New(slog.DiscardHandler)
	}
	return logging.WithInvocation(ctx, base, rt.Lambda, cold), cold
}

// Metrics returns a metrics document for one invocation: dimension
// FunctionName, the ColdStart count, and the request id as a property so a
// metric can be traced back to its logs.
func (rt *Runtime) Metrics(ctx context.Context, cold bool) *emf.Logger {
	ns := rt.MetricsNamespace
	if ns == "" {
		ns = config.DefaultMetricsNamespace
	}
	m, err := emf.New(ns, emf.Dimension{Name: "FunctionName", Value: rt.FunctionName()})
	if err != nil {
		// The namespace was validated at cold start; a failure here means a
		// bug, and metrics must never fail an invocation.
		return nil
	}
	coldStart := 0.0
	if cold {
		coldStart = 1
	}
	_ = m.Put("ColdStart", coldStart, emf.Count)
	if id := requestID(ctx); id != "" {
		_ = m.SetProperty("function_request_id", id)
	}
	return m
}

func (rt *Runtime) Flush(m *emf.Logger, log *slog.Logger) {
	if m == nil {
		return
	}
	out := rt.MetricsOut
	if out == nil {
		out = os.Stdout
	}
	if err := m.Flush(out); err != nil {
		log.Warn("metrics not written", "error", err.Error())
	}
}

// FunctionName is the Lambda function's name, or Function outside Lambda.
func (rt *Runtime) FunctionName() string {
	if name := rt.Lambda.FunctionName; name != "" {
		return name
	}
	return rt.Function
}

// Put records one metric, ignoring its error: a bad metric must never fail
// an invocation, and the names and units used are constants.
func Put(m *emf.Logger, name string, value float64, unit emf.Unit) {
	if m != nil {
		_ = m.Put(name, value, unit)
	}
}

// PutWith is Put with extra dimensions.
func PutWith(m *emf.Logger, dims []emf.Dimension, name string, value float64, unit emf.Unit) {
	if m != nil {
		_ = m.PutWith(dims, name, value, unit)
	}
}

// Milliseconds converts a duration for a Milliseconds metric.
func Milliseconds(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func requestID(ctx context.Context) string {
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		return lc.AwsRequestID
	}
	return ""
}
