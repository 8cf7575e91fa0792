package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outbox/headers"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

const (
	validParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	validState  = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
)

// traceContextCases are producers' trace headers, each with the words the
// refusal must hold ("" for a header that is taken).
var traceContextCases = []struct {
	name    string
	headers map[string]string
	refusal string
}{
	{"traceparent alone", map[string]string{"traceparent": validParent}, ""},
	{"traceparent not sampled", map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}, ""},
	{"traceparent sampled and random", map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03"}, ""},
	{"with tracestate", map[string]string{"traceparent": validParent, "tracestate": validState}, ""},
	{"tracestate with spaces around members and an empty one", map[string]string{"traceparent": validParent, "tracestate": " rojo=1 ,,congo=2"}, ""},
	{"tracestate multi-tenant key", map[string]string{"traceparent": validParent, "tracestate": "t0@vendor=x y"}, ""},
	{"tracestate of 32 members", map[string]string{"traceparent": validParent, "tracestate": members(32)}, ""},
	{"capitalised traceparent", map[string]string{"Traceparent": validParent}, `must be written "traceparent"`},
	{"capitalised tracestate", map[string]string{"traceparent": validParent, "TraceState": validState}, `must be written "tracestate"`},
	{"traceparent uppercase hex", map[string]string{"traceparent": strings.ToUpper(validParent)}, "not a version 00 traceparent"},
	{"traceparent version 01", map[string]string{"traceparent": "01" + validParent[2:]}, "not a version 00 traceparent"},
	{"traceparent version ff", map[string]string{"traceparent": "ff" + validParent[2:]}, "not a version 00 traceparent"},
	{"traceparent with a field more", map[string]string{"traceparent": validParent + "-00"}, "not a version 00 traceparent"},
	{"traceparent short trace id", map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01"}, "not a version 00 traceparent"},
	{"traceparent reserved flag", map[string]string{"traceparent": validParent[:53] + "09"}, "not a version 00 traceparent"},
	{"traceparent zero trace id", map[string]string{"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}, "trace id of all zeros"},
	{"traceparent zero parent id", map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"}, "parent id of all zeros"},
	{"traceparent garbage", map[string]string{"traceparent": "not-a-trace"}, "not a version 00 traceparent"},
	{"tracestate without traceparent", map[string]string{"tracestate": validState}, "without a traceparent"},
	{"tracestate member without =", map[string]string{"traceparent": validParent, "tracestate": "rojo"}, "is not key=value"},
	{"tracestate uppercase key", map[string]string{"traceparent": validParent, "tracestate": "Rojo=1"}, "is not key=value"},
	{"tracestate empty value", map[string]string{"traceparent": validParent, "tracestate": "rojo="}, "has a value that is empty"},
	{"tracestate value with =", map[string]string{"traceparent": validParent, "tracestate": "rojo=a=b"}, "has a value that is empty"},
	{"tracestate whitespace member", map[string]string{"traceparent": validParent, "tracestate": "rojo=1, ,congo=2"}, "is not key=value"},
	{"tracestate duplicate key", map[string]string{"traceparent": validParent, "tracestate": "rojo=1,rojo=2"}, "the key \"rojo\" twice"},
	{"tracestate of 33 members", map[string]string{"traceparent": validParent, "tracestate": members(33)}, "more than 32 members"},
	{"tracestate over 512 bytes", map[string]string{"traceparent": validParent, "tracestate": "a=" + strings.Repeat("v", 255) + ",b=" + strings.Repeat("v", 255)}, "over the limit of 512"},
}

func members(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("k" + strconv.Itoa(i) + "=1")
	}
	return b.String()
}

// A producer's W3C trace context is taken or refused alike by the Go
// producer and by both SQL functions (a producer in another language calls
// those), with an error that names the problem; and what is taken, an
// OpenTelemetry consumer reads back whole.
func TestTraceContextHeadersAreCheckedAlikeInGoAndSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	producer := pgtest.Pool(t, db.LoginAs(t, "outbox_producer"))
	calls := map[string]string{
		"enqueue":       `SELECT outbox.enqueue('billing', 'usage', '{}'::jsonb, p_headers => $1::jsonb)`,
		"enqueue_batch": `SELECT outbox.enqueue_batch(ARRAY['billing'], ARRAY['usage'], ARRAY['{}'], p_headers => ARRAY[$1::text])`,
	}
	for _, tc := range traceContextCases {
		t.Run(tc.name, func(t *testing.T) {
			doc, _ := json.Marshal(tc.headers)
			_, goErr := outbox.Enqueue(ctx, producer, outbox.Message{Namespace: "billing", Topic: "usage", Payload: []byte(`{}`), Headers: tc.headers})
			var refused *outbox.ValidationError
			if tc.refusal == "" && goErr != nil {
				t.Errorf("Go producer refused: %v", goErr)
			}
			if tc.refusal != "" && (!errors.As(goErr, &refused) || refused.Field != "headers" || !strings.Contains(goErr.Error(), tc.refusal)) {
				t.Errorf("Go producer: %v, want its own refusal of headers saying %q", goErr, tc.refusal)
			}
			for call, sql := range calls {
				_, err := producer.Exec(ctx, sql, string(doc))
				switch {
				case tc.refusal == "" && err != nil:
					t.Errorf("%s refused: %v", call, err)
				case tc.refusal != "" && (sqlstate(err) != "P7004" || !strings.Contains(err.Error(), tc.refusal)):
					t.Errorf("%s: %v, want P7004 saying %q", call, err, tc.refusal)
				}
			}
			if tc.refusal == "" {
				checkOpenTelemetryReads(t, tc.headers)
			}
		})
	}
}

// checkOpenTelemetryReads extracts the context with OpenTelemetry's own
// propagator, as a consumer would from a webhook delivery's headers.
func checkOpenTelemetryReads(t *testing.T, hs map[string]string) {
	t.Helper()
	h := http.Header{}
	for name, value := range hs {
		h.Set(name, value)
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(h)))
	parent := hs["traceparent"]
	if !sc.IsValid() || sc.TraceID().String() != parent[3:35] || sc.SpanID().String() != parent[36:52] {
		t.Errorf("OpenTelemetry read %v from %q", sc, parent)
	}
	if state, ok := hs["tracestate"]; ok {
		parsed, err := trace.ParseTraceState(state)
		if err != nil || parsed.Len() != sc.TraceState().Len() || parsed.Len() == 0 {
			t.Errorf("OpenTelemetry read tracestate %q as %q (%v)", state, sc.TraceState(), err)
		}
	}
}

// Every trace context the producer takes, OpenTelemetry reads as the same
// trace; a version 00 traceparent OpenTelemetry reads, the producer takes.
// (The producer is stricter on purpose: it refuses other versions, and a
// tracestate over the specification's 512 bytes.)
func FuzzTraceContextAgreesWithOpenTelemetry(f *testing.F) {
	for _, tc := range traceContextCases {
		f.Add(tc.headers["traceparent"], tc.headers["tracestate"])
	}
	f.Fuzz(func(t *testing.T, parent, state string) {
		if parent == "" || strings.ContainsAny(parent+state, "\x00\r\n\t") {
			return
		}
		parentProblem := headers.TraceContextProblem("traceparent", parent, true)
		h := http.Header{"Traceparent": {parent}}
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(h)))
		switch {
		case parentProblem == "" && (!sc.IsValid() || sc.TraceID().String() != parent[3:35] || sc.SpanID().String() != parent[36:52]):
			t.Fatalf("taken %q, which OpenTelemetry reads as %v", parent, sc)
		case parentProblem != "" && sc.IsValid() && strings.HasPrefix(parent, "00-"):
			t.Fatalf("refused %q (%s), which OpenTelemetry reads", parent, parentProblem)
		}
		if state == "" {
			return
		}
		stateProblem := headers.TraceContextProblem("tracestate", state, true)
		_, err := trace.ParseTraceState(state)
		switch {
		case stateProblem == "" && err != nil:
			t.Fatalf("taken tracestate %q, which OpenTelemetry refuses: %v", state, err)
		case stateProblem != "" && err == nil && len(state) <= headers.MaxTraceStateBytes:
			t.Fatalf("refused tracestate %q (%s), which OpenTelemetry reads", state, stateProblem)
		}
	})
}
