package logging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/outboxkit/dispatcher/shared/telemetry/logging"
)

const (
	requestID   = "c6af9ac6-7b61-11e6-9a41-93e812345678"
	functionARN = "arn:aws:lambda:eu-west-1:123456789012:function:outbox-dispatch"
	traceRoot   = "1-5759e988-bd862e3fe1be46a994272793"
	traceHeader = "Root=" + traceRoot + ";Parent=53995c3f42cd8ad8;Sampled=1"
)

// lambdaContext is the context aws-lambda-go hands a handler.
func lambdaContext() context.Context {
	ctx := lambdacontext.NewContext(context.Background(), &lambdacontext.LambdaContext{
		AwsRequestID:       requestID,
		InvokedFunctionArn: functionARN,
	})
	//nolint:staticcheck // aws-lambda-go's own key: an untyped string
	return context.WithValue(ctx, "x-amzn-trace-id", traceHeader)
}

// records parses every line of out as one JSON object.
func records(t *testing.T, out *bytes.Buffer) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		dec := json.NewDecoder(strings.NewReader(line))
		dec.UseNumber()
		if err := dec.Decode(&rec); err != nil {
			t.Fatalf("not a JSON object: %v\n%s", err, line)
		}
		recs = append(recs, rec)
	}
	return recs
}

// lambda is what the runtime says of the function.
var lambda = logging.Lambda{FunctionName: "outbox-dispatch", MemoryMB: 512}

func TestEveryPowertoolsKeyInsideALambdaContext(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	base := logging.New(&out, "outbox-dispatch", slog.LevelInfo)
	var cold logging.ColdStart

	before := time.Now().UTC().Truncate(time.Millisecond)
	log := logging.WithInvocation(lambdaContext(), base, lambda, cold.Take())
	log.Info("claimed a batch", "message_id", "0190a3c4-5d6e-7f80-9a0b-1c2d3e4f5a6b", "claimed", 500)
	after := time.Now().UTC()

	recs := records(t, &out)
	if len(recs) != 1 {
		t.Fatalf("%d records", len(recs))
	}
	rec := recs[0]
	want := map[string]any{
		"level":                "INFO",
		"message":              "claimed a batch",
		"service":              "outbox-dispatch",
		"cold_start":           true,
		"function_name":        "outbox-dispatch",
		"function_request_id":  requestID,
		"function_arn":         functionARN,
		"function_memory_size": json.Number("512"),
		"xray_trace_id":        traceRoot,
		"message_id":           "0190a3c4-5d6e-7f80-9a0b-1c2d3e4f5a6b",
		"claimed":              json.Number("500"),
	}
	for k, v := range want {
		if rec[k] != v {
			t.Errorf("%s = %#v, want %#v", k, rec[k], v)
		}
	}
	for _, builtin := range []string{"time", "msg"} {
		if _, ok := rec[builtin]; ok {
			t.Errorf("slog's key %q is in the record; Powertools names it differently", builtin)
		}
	}
	ts, _ := rec["timestamp"].(string)
	parsed, err := time.Parse(time.RFC3339, ts)
	if err != nil || !strings.HasSuffix(ts, "Z") || len(ts) != len("2006-01-02T15:04:05.000Z") {
		t.Fatalf("timestamp %q is not RFC 3339 in UTC with milliseconds: %v", ts, err)
	}
	if parsed.Before(before) || parsed.After(after) {
		t.Errorf("timestamp %s outside [%s, %s]", parsed, before, after)
	}
}

// Without the trace header in the context (a handler that dropped it), the
// trace id comes from the runtime's _X_AMZN_TRACE_ID, which aws-lambda-go
// also sets.
func TestTraceIDFromTheRuntime(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	header := func() string { return "Root=1-67891233-abcdef012345678912345678;Parent=463ac35c9f6413ad;Sampled=0" }
	logging.WithInvocation(context.Background(), logging.New(&out, "svc", slog.LevelInfo), logging.Lambda{TraceHeader: header}, false).Info("x")
	if got := records(t, &out)[0]["xray_trace_id"]; got != "1-67891233-abcdef012345678912345678" {
		t.Fatalf("xray_trace_id = %v", got)
	}
}

func TestOutsideLambdaTheInvocationKeysAreLeftOut(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	logging.WithInvocation(context.Background(), logging.New(&out, "outboxctl", slog.LevelInfo), logging.Lambda{}, false).Info("replayed")
	rec := records(t, &out)[0]
	for _, k := range []string{"function_name", "function_request_id", "function_arn", "function_memory_size", "xray_trace_id"} {
		if v, ok := rec[k]; ok {
			t.Errorf("%s = %v outside Lambda, want it left out", k, v)
		}
	}
	if rec["cold_start"] != false || rec["service"] != "outboxctl" {
		t.Errorf("record %v", rec)
	}
}

// The pattern for main: one ColdStart per process, Take per invocation.
func TestColdStartIsTrueForTheFirstInvocationOnly(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	base := logging.New(&out, "outbox-dispatch", slog.LevelInfo)
	var cold logging.ColdStart
	handler := func(ctx context.Context) {
		logging.WithInvocation(ctx, base, lambda, cold.Take()).Info("invoked")
	}
	for range 3 {
		handler(lambdaContext())
	}
	var got []any
	for _, rec := range records(t, &out) {
		got = append(got, rec["cold_start"])
	}
	if fmt.Sprint(got) != "[true false false]" {
		t.Fatalf("cold_start over three invocations: %v, want [true false false]", got)
	}

	// However many goroutines race for it (Lambda managed instances run
	// invocations concurrently), exactly one wins.
	var race logging.ColdStart
	var winners atomic.Int32
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if race.Take() {
				winners.Add(1)
			}
		}()
	}
	wg.Wait()
	if winners.Load() != 1 {
		t.Fatalf("%d cold starts, want 1", winners.Load())
	}
}

func TestProvisionedConcurrencyIsNeverAColdStart(t *testing.T) {
	t.Parallel()
	cold := logging.ColdStart{Provisioned: true}
	if cold.Take() || cold.Take() {
		t.Fatal("Take reported a cold start under provisioned concurrency")
	}
}

func TestParseLevel(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		lambda bool
		want   slog.Level
		ok     bool
	}{
		{"debug", false, slog.LevelDebug, true},
		{"WARN", false, slog.LevelWarn, true},
		{" warning ", false, slog.LevelWarn, true},
		{"error", false, slog.LevelError, true},
		{"info", false, slog.LevelInfo, true},
		{"verbose", false, 0, false},
		{"trace", false, 0, false},
		{"TRACE", true, logging.LevelTrace, true},
		{"FATAL", true, logging.LevelFatal, true},
		{"LOUD", true, 0, false},
	}
	for _, tc := range cases {
		got, ok := logging.ParseLevel(tc.name, tc.lambda)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("ParseLevel(%q, %t) = %v, %t; want %v, %t", tc.name, tc.lambda, got, ok, tc.want, tc.ok)
		}
	}
}

func TestLevelNamesAreLambdas(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	log := logging.New(&out, "svc", logging.LevelTrace)
	ctx := context.Background()
	for _, l := range []slog.Level{logging.LevelTrace, slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError, logging.LevelFatal} {
		log.Log(ctx, l, "x")
	}
	var got []any
	for _, rec := range records(t, &out) {
		got = append(got, rec["level"])
	}
	if fmt.Sprint(got) != "[TRACE DEBUG INFO WARN ERROR FATAL]" {
		t.Fatalf("levels %v", got)
	}

	out.Reset()
	warn := logging.New(&out, "svc", slog.LevelWarn)
	warn.Info("dropped")
	warn.Debug("dropped")
	warn.Warn("kept")
	if recs := records(t, &out); len(recs) != 1 || recs[0]["message"] != "kept" {
		t.Fatalf("at WARN: %v", recs)
	}
}

// claimedMessage is shaped like outboxtype.Message: logging one whole must not
// carry its payload or its headers' credentials into the log.
type claimedMessage struct {
	ID      string
	Topic   string
	Payload json.RawMessage
	Headers map[string]string
}

type secretValuer struct{}

func (secretValuer) LogValue() slog.Value {
	return slog.GroupValue(slog.String("user", "outbox"), slog.String("token", "tok-SECRET-9"))
}

// logEverythingDangerous logs, in every shape we could think of, the things
// that must never reach a log, next to the things an operator needs.
func logEverythingDangerous(log *slog.Logger) {
	const card = `{"card_number":"4111111111111111"}`
	connErr := fmt.Errorf("lease: claim: %w", errors.New("failed to connect to postgres://outbox:hunter2@db.internal:5432/outbox"))

	log.Info("claimed", "message_id", "m-1", "payload", card)
	log.Info("claimed", "message_id", "m-2", "Payload", json.RawMessage(card))
	log.Info("claimed", "message_id", "m-3", slog.Group("payload", "card_number", "4111111111111111"), "after", "kept")
	log.WithGroup("payload").Info("grouped", "card_number", "4111111111111111")
	log.With("db_password", "hunter2").Info("configured", "code", "OK")
	log.Error("claim failed", "code", "DB_UNAVAILABLE", "error", connErr)
	log.Error("cannot reach postgres://outbox:hunter2@db.internal/outbox", "attempt", 3)
	log.Warn("nested", slog.Group("db", slog.Group("conn", "dsn", "host=db user=outbox password=hunter2 dbname=outbox")))
	log.Warn("nested", slog.Group("db", "attempt", 1, slog.Group("auth", "password", "hunter2")))
	log.Info("message", "msg", claimedMessage{
		ID: "m-4", Topic: "usage", Payload: json.RawMessage(card),
		Headers: map[string]string{"Authorization": "Bearer eyJhbGci.eyJzdWIi.s1gn4ture", "traceparent": "00-abc-01"},
	})
	log.Info("valuer", "creds", secretValuer{})
	log.Info("bytes", "body", []byte(card))
	log.Info("raw JSON", "data", json.RawMessage(card))
	log.Info("map", "target", map[string]any{"url": "https://u:hunter2@hooks.example.com/in", "api_key": "k-SECRET-1"})
}

var neverInTheLog = []string{"4111111111111111", "hunter2", "s1gn4ture", "tok-SECRET-9", "k-SECRET-1"}

func TestPayloadsAndPasswordsNeverReachTheLog(t *testing.T) {
	t.Parallel()
	// The fixture leaks through a plain slog handler, so this test can fail.
	var plain bytes.Buffer
	logEverythingDangerous(slog.New(slog.NewJSONHandler(&plain, nil)))
	for _, secret := range neverInTheLog {
		if !strings.Contains(plain.String(), secret) {
			t.Fatalf("the fixture does not log %q even without redaction", secret)
		}
	}

	var out bytes.Buffer
	logEverythingDangerous(logging.New(&out, "outbox-dispatch", slog.LevelDebug))
	for _, secret := range neverInTheLog {
		if strings.Contains(out.String(), secret) {
			t.Errorf("%q reached the log:\n%s", secret, out.String())
		}
	}
	recs := records(t, &out) // every line is still valid JSON
	if len(recs) != 14 {
		t.Fatalf("%d records, want 14 (redaction drops values, never records)", len(recs))
	}
	// What the operator needs is still there.
	mustContain := []string{
		`"message_id":"m-1"`, `"message_id":"m-3"`, `"after":"kept"`, `"code":"DB_UNAVAILABLE"`,
		`"error":"lease: claim: failed to connect to postgres://outbox:[REDACTED]@db.internal:5432/outbox"`,
		`"message":"cannot reach postgres://outbox:[REDACTED]@db.internal/outbox"`,
		`password=[REDACTED] dbname=outbox`, `"ID":"m-4"`, `"traceparent":"00-abc-01"`,
		`"user":"outbox"`, `"body":"[34 bytes]"`, `"data":"[34 bytes of JSON]"`, `"url":"https://u:[REDACTED]@hooks.example.com/in"`,
	}
	for _, s := range mustContain {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the log lost %s:\n%s", s, out.String())
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Count(line, `"message":`) > 1 {
			t.Errorf("two message keys in one record: %s", line)
		}
	}
	if recs[9]["attr_msg"] == nil {
		t.Errorf("the caller's own \"msg\" attribute was not kept apart: %v", recs[9])
	}
	for _, key := range []string{`"payload"`, `"Payload"`, `"db_password"`, `"Authorization"`, `"token"`, `"api_key"`, `"auth"`} {
		if strings.Contains(out.String(), key) {
			t.Errorf("the sensitive key %s is in the log:\n%s", key, out.String())
		}
	}
}

func TestRedactError(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("dbpool: %w", errors.New("cannot parse `host=db user=app password=hunter2`: bad port"))
	got := logging.RedactError(err)
	if strings.Contains(got, "hunter2") || !strings.Contains(got, "bad port") {
		t.Fatalf("RedactError = %q", got)
	}
	if logging.RedactError(nil) != "" {
		t.Fatal("RedactError(nil) is not empty")
	}
}
