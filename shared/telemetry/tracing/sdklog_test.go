package tracing

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-xray-sdk-go/xray"
	"github.com/aws/aws-xray-sdk-go/xraylog"
	"github.com/jackc/pgx/v5"
)

type text string

func (s text) String() string { return string(s) }

// captureOutput redirects slog.Default, os.Stdout and os.Stderr for the
// test and returns what they received. The test must not be parallel.
func captureOutput(t *testing.T) func() string {
	t.Helper()
	var logs bytes.Buffer
	previous := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&logs, nil)))
	stdout, stderr := os.Stdout, os.Stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout, os.Stderr = w, w
	piped := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		piped <- string(b)
	}()
	var out string
	done := false
	restore := func() string {
		if !done {
			done = true
			os.Stdout, os.Stderr = stdout, stderr
			slog.SetDefault(previous)
			w.Close()
			out = <-piped + logs.String()
		}
		return out
	}
	t.Cleanup(func() { restore() })
	return restore
}

// The SDK's own logger is replaced: its chatter is dropped and its errors
// reach slog as warnings, at most one a minute.
func TestTheSDKLoggerIsQuiet(t *testing.T) {
	lastSDKError.Store(0)
	output := captureOutput(t)
	logger := sdkLogger{}
	logger.Log(xraylog.LogLevelDebug, text("Beginning subsegment named x"))
	logger.Log(xraylog.LogLevelInfo, text("Emitter using address: 127.0.0.1:2000"))
	logger.Log(xraylog.LogLevelWarn, text("failed to record HTTP transaction"))
	logger.Log(xraylog.LogLevelError, text("write udp: connection refused; postgres://u:hunter2@db"))
	logger.Log(xraylog.LogLevelError, text("write udp: connection refused (again)"))
	got := output()
	if strings.Count(got, "\n") != 1 || !strings.Contains(got, `"level":"WARN"`) || !strings.Contains(got, "connection refused") {
		t.Fatalf("want exactly one warning for the first error, got:\n%s", got)
	}
	for _, noise := range []string{"Beginning", "Emitter", "failed to record", "again", "hunter2"} {
		if strings.Contains(got, noise) {
			t.Errorf("%q was logged", noise)
		}
	}
}

// Without a segment in the context the SDK complains ("failed to begin
// subsegment"). The disabled tracer never calls it, and the enabled one
// neither starts a span nor complains where there is no trace to join.
func TestNoSegmentNoComplaint(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		io.WriteString(w, `{"Entries":[],"FailedEntryCount":0}`)
	}))
	defer srv.Close()
	ctx := context.Background()
	exercise := func(tr *Tracer) {
		sctx, span := tr.Start(ctx, "dispatch")
		span.SetAttribute("n", 1)
		span.End(nil)
		q := tr.PgxTracer()
		q.TraceQueryEnd(q.TraceQueryStart(sctx, nil, pgx.TraceQueryStartData{SQL: "SELECT 1"}), nil, pgx.TraceQueryEndData{})
		req, _ := http.NewRequestWithContext(sctx, http.MethodGet, srv.URL, nil)
		if resp, err := tr.HTTPClient(srv.Client()).Do(req); err == nil {
			resp.Body.Close()
		}
		cfg := aws.Config{Region: "eu-west-1", HTTPClient: srv.Client(), RetryMaxAttempts: 1,
			Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")}
		tr.InstrumentAWS(&cfg)
		eb := eventbridge.NewFromConfig(cfg, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(srv.URL) })
		_, err := eb.PutEvents(sctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
			Source: aws.String("outbox.billing"), DetailType: aws.String("usage"), Detail: aws.String("{}"),
		}}})
		if err != nil {
			t.Errorf("PutEvents: %v", err)
		}
		_ = tr.TraceHeader(sctx)
	}

	// The check can fail: the SDK itself, asked for a subsegment without a
	// segment, reports an error (which our logger counts).
	lastSDKError.Store(0)
	output := captureOutput(t)
	_, seg := xray.BeginSubsegment(ctx, "orphan")
	if seg != nil || lastSDKError.Load() == 0 {
		t.Fatalf("the SDK did not complain about a missing segment (segment %v)", seg)
	}
	output()

	for name, tr := range map[string]*Tracer{
		"disabled":       New(Config{Reason: "off"}),
		"enabled Lambda": New(Config{Enabled: true, DaemonAddress: "127.0.0.1:9", InLambda: true}),
	} {
		lastSDKError.Store(0)
		output := captureOutput(t)
		exercise(tr)
		if got := output(); got != "" || lastSDKError.Load() != 0 {
			t.Errorf("%s tracer, no trace in the context: the SDK reported an error (%v) or something was written:\n%s", name, lastSDKError.Load() != 0, got)
		}
	}
}
