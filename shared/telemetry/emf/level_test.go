package emf_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/telemetry/emf"
	"github.com/outboxkit/dispatcher/shared/testkit/emftest"
)

// Lambda's log-level filtering reads a document without a level as INFO:
// under an application log level of WARN or ERROR every metric would be
// dropped, and an alarm that treats missing data as breaching would fire.
// Every document must pass the filter, whatever the level.
func TestDocumentsPassLambdasLogLevelFilter(t *testing.T) {
	// Not parallel: the level comes from the environment, as on Lambda.
	for _, tc := range []struct{ applicationLevel, want string }{
		{"", "INFO"}, {"TRACE", "INFO"}, {"DEBUG", "INFO"}, {"INFO", "INFO"},
		{"WARN", "WARN"}, {"ERROR", "ERROR"}, {"FATAL", "FATAL"}, {"error", "ERROR"},
	} {
		t.Run("AWS_LAMBDA_LOG_LEVEL="+tc.applicationLevel, func(t *testing.T) {
			t.Setenv("AWS_LAMBDA_LOG_LEVEL", tc.applicationLevel)
			m := newLogger(t, fn)
			at := time.Date(2026, 3, 1, 3, 4, 5, 678_000_000, time.UTC)
			m.SetTimestamp(at)
			must(t, m.Put("Claimed", 500, emf.Count))
			must(t, m.PutWith([]emf.Dimension{{Name: "TargetType", Value: "sns"}}, "DispatchLatency", 12.5, emf.Milliseconds))
			var out bytes.Buffer
			must(t, m.Flush(&out))
			emftest.Parse(t, out.Bytes()) // still valid EMF

			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("%d documents, want 2:\n%s", len(lines), out.String())
			}
			for _, line := range lines {
				if !emftest.LambdaKeeps([]byte(line), tc.applicationLevel) {
					t.Errorf("Lambda drops this document under ApplicationLogLevel %q:\n%s", tc.applicationLevel, line)
				}
				var doc struct {
					Level     string `json:"level"`
					Timestamp string `json:"timestamp"`
				}
				if err := json.Unmarshal([]byte(line), &doc); err != nil {
					t.Fatal(err)
				}
				if doc.Level != tc.want {
					t.Errorf("level %q, want %q: the least severe level the filter lets through", doc.Level, tc.want)
				}
				if ts, err := time.Parse(time.RFC3339Nano, doc.Timestamp); err != nil || !ts.Equal(at) {
					t.Errorf("timestamp %q (%v), want %s, the document's _aws.Timestamp", doc.Timestamp, err, at.Format(time.RFC3339Nano))
				}
			}
		})
	}
}

// The filter model drops what Lambda drops, so that the test above can fail.
func TestLambdaFilterModel(t *testing.T) {
	t.Parallel()
	const ts = `"timestamp":"2026-03-01T03:04:05.678Z"`
	for _, tc := range []struct {
		line, level string
		kept        bool
	}{
		{`{"_aws":{},"Claimed":1}`, "", true},
		{`{"_aws":{},"Claimed":1}`, "INFO", true},
		{`{"_aws":{},"Claimed":1}`, "WARN", false},
		{`{"_aws":{},"Claimed":1,` + ts + `}`, "ERROR", false},
		{`{"level":"error","_aws":{}}`, "ERROR", false}, // no timestamp: INFO
		{`{"level":"error",` + ts + `}`, "ERROR", true},
		{`{"level":"WARNING",` + ts + `}`, "WARN", false}, // unknown level: INFO
		{`{"level":"DEBUG",` + ts + `}`, "INFO", false},
		{`{"level":"FATAL",` + ts + `}`, "FATAL", true},
		{`not json`, "WARN", false},
	} {
		if got := emftest.LambdaKeeps([]byte(tc.line), tc.level); got != tc.kept {
			t.Errorf("LambdaKeeps(%s, %q) = %v, want %v", tc.line, tc.level, got, tc.kept)
		}
	}
}

func TestFilterMembersAreReserved(t *testing.T) {
	t.Parallel()
	m := newLogger(t, fn)
	for name, err := range map[string]error{
		"metric level":        m.Put("level", 1, emf.Count),
		"metric timestamp":    m.Put("timestamp", 1, emf.Count),
		"property level":      m.SetProperty("level", "x"),
		"property timestamp":  m.SetProperty("timestamp", "x"),
		"dimension level":     m.PutWith([]emf.Dimension{{Name: "level", Value: "x"}}, "Claimed", 1, emf.Count),
		"dimension timestamp": m.PutWith([]emf.Dimension{{Name: "timestamp", Value: "x"}}, "Claimed", 1, emf.Count),
	} {
		if !errors.Is(err, emf.ErrInvalidName) {
			t.Errorf("%s: %v, want ErrInvalidName", name, err)
		}
	}
	if _, err := emf.New("Outbox", emf.Dimension{Name: "level", Value: "x"}); !errors.Is(err, emf.ErrInvalidName) {
		t.Errorf("default dimension level: %v, want ErrInvalidName", err)
	}
}
