package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/sink"
)

// invocation is one in-process run of outboxctl.
type invocation struct {
	// env is the environment the command sees for OUTBOX_* variables:
	// nothing else of the test process's own leaks in, so a developer's
	// OUTBOX_DATABASE_URL cannot redirect a test. Other variables come
	// from the process.
	env   map[string]string
	stdin string
	ctx   context.Context
	// out, when set, receives the command's output as it is written, for
	// a test that watches it while the command runs.
	out *syncBuffer
}

type result struct {
	out  string
	err  error
	code int
}

// cli runs outboxctl in-process, as main would, without touching the
// process environment, so that tests run in parallel.
func cli(t *testing.T, inv invocation, args ...string) result {
	t.Helper()
	getenv := func(name string) string {
		if v, ok := inv.env[name]; ok {
			return v
		}
		if strings.HasPrefix(name, "OUTBOX_") {
			return ""
		}
		return os.Getenv(name)
	}
	root := newRootCommandWithEnv(getenv)
	out := inv.out
	if out == nil {
		out = &syncBuffer{}
	}
	root.SetOut(out)
	root.SetErr(out)
	root.SetIn(strings.NewReader(inv.stdin))
	root.SetArgs(args)
	ctx := inv.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	err := root.ExecuteContext(ctx)
	r := result{out: out.String(), err: err}
	if err != nil {
		r.code = exitCode(err)
		if strings.Contains(oneLine(err), "\n") {
			t.Errorf("%v: the error is more than one line: %q", args, oneLine(err))
		}
	}
	return r
}

// db is the environment of a command against url.
func db(url string, extra ...string) invocation {
	env := map[string]string{"OUTBOX_DATABASE_URL": url, "OUTBOX_TRACING": "off"}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return invocation{env: env}
}

// wantOK fails the test unless the command succeeded and printed every
// fragment.
func (r result) wantOK(t *testing.T, args string, fragments ...string) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("%s: %v\n%s", args, r.err, r.out)
	}
	for _, f := range fragments {
		if !strings.Contains(r.out, f) {
			t.Errorf("%s: output lacks %q:\n%s", args, f, r.out)
		}
	}
}

// wantError fails the test unless the command failed with the exit code
// and a one-line error containing want.
func (r result) wantError(t *testing.T, args string, code int, want string) {
	t.Helper()
	if r.err == nil {
		t.Errorf("%s: succeeded, want exit %d with %q:\n%s", args, code, want, r.out)
		return
	}
	if r.code != code || !strings.Contains(oneLine(r.err), want) {
		t.Errorf("%s: exit %d %q, want exit %d with %q", args, r.code, oneLine(r.err), code, want)
	}
}

// syncBuffer is an output that goroutines (a server's handler) may write
// while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor polls until cond holds, failing the test after bound.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func enqueueMessages(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) {
	t.Helper()
	if _, err := outbox.EnqueueBatch(context.Background(), pool, msgs); err != nil {
		t.Fatal(err)
	}
}

func usageMessage(i int) outbox.Message {
	return outbox.Message{
		Namespace: "billing", Topic: "usage_snapshot", TenantID: fmt.Sprintf("tenant-%d", i%3),
		DedupeKey: fmt.Sprintf("tenant-%d/turn-%d", i%3, i),
		Payload:   json.RawMessage(fmt.Sprintf(`{"turn":%d,"tokens":%d}`, i, 100+i)),
		Headers:   map[string]string{"schema": "usage/v1"},
	}
}

// testSecret signs the test sinks' deliveries.
const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// startSink runs the local sink (the receiver of `outboxctl sink`) in the
// test, with an in-memory deduper, refusing poison=true.
func startSink(t *testing.T, delay time.Duration) (*localSink, string) {
	t.Helper()
	key, err := webhook.ParseSecret(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	s := newLocalSink(key, sink.NewMemoryDeduper(), []rejectRule{{"poison", "true"}}, delay, nil, sinkFaults{}, quietLog())
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL + "/usage"
}

// routesTo is an OUTBOX_ROUTES sending namespace billing to url, signed
// with testSecret through SINK_SECRET.
func routesTo(url string) string {
	return fmt.Sprintf(`{"routes":[{"match":{"namespace":"billing","topic":"*"},
		"target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET","timeout":"30s"},
		"retry":{"max_attempts":5,"base_delay":"1s","max_delay":"10s"}}]}`, url)
}

var _ io.Writer = (*syncBuffer)(nil)

// postSigned sends body to url as a Standard Webhooks delivery with
// webhook-id id, signed with secret, and returns the answer's status.
func postSigned(url, id, body, secret string) (int, error) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return 0, err
	}
	now := time.Now()
	signature, err := wh.Sign(id, now, []byte(body))
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", signature)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
