package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

func TestStatusMapping(t *testing.T) {
	t.Parallel()
	clock := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	cases := []struct {
		name       string
		status     int
		header     map[string]string
		kind       publish.Kind
		code       outboxtype.Code
		ref        string
		retryAfter time.Duration
	}{
		{name: "200 delivered", status: 200, kind: publish.Delivered, ref: "HTTP 200"},
		{name: "204 delivered", status: 204, kind: publish.Delivered, ref: "HTTP 204"},
		{name: "409 terminal", status: 409, kind: publish.Terminal, code: outboxtype.CodeTargetRejected},
		{name: "400 terminal", status: 400, kind: publish.Terminal, code: outboxtype.CodeTargetRejected},
		{name: "422 terminal", status: 422, kind: publish.Terminal, code: outboxtype.CodeTargetRejected},
		{name: "404 not found", status: 404, kind: publish.Terminal, code: outboxtype.CodeTargetNotFound},
		{name: "410 gone", status: 410, kind: publish.Terminal, code: outboxtype.CodeTargetNotFound},
		{name: "401 denied", status: 401, kind: publish.Terminal, code: outboxtype.CodeAccessDenied},
		{name: "403 denied", status: 403, kind: publish.Terminal, code: outboxtype.CodeAccessDenied},
		{name: "408 timeout", status: 408, kind: publish.Retryable, code: outboxtype.CodeTimeout},
		{name: "425 too early", status: 425, kind: publish.Retryable, code: outboxtype.CodeTarget5xx},
		{name: "429 retry-after seconds", status: 429, header: map[string]string{"Retry-After": "7"},
			kind: publish.Retryable, code: outboxtype.CodeThrottled, retryAfter: 7 * time.Second},
		{name: "429 retry-after date", status: 429,
			header: map[string]string{"Retry-After": clock.Add(90 * time.Second).Format(http.TimeFormat)},
			kind:   publish.Retryable, code: outboxtype.CodeThrottled, retryAfter: 90 * time.Second},
		{name: "429 retry-after absurd", status: 429, header: map[string]string{"Retry-After": "99999999999999999999"},
			kind: publish.Retryable, code: outboxtype.CodeThrottled, retryAfter: 24 * time.Hour},
		{name: "429 retry-after garbage", status: 429, header: map[string]string{"Retry-After": "soon"},
			kind: publish.Retryable, code: outboxtype.CodeThrottled},
		{name: "500 retryable", status: 500, kind: publish.Retryable, code: outboxtype.CodeTarget5xx},
		{name: "503 retry-after", status: 503, header: map[string]string{"Retry-After": "120"},
			kind: publish.Retryable, code: outboxtype.CodeTarget5xx, retryAfter: 2 * time.Minute},
		{name: "301 not followed", status: 301, header: map[string]string{"Location": "/elsewhere"},
			kind: publish.Terminal, code: outboxtype.CodeTargetRejected},
		{name: "307 not followed", status: 307, header: map[string]string{"Location": "/elsewhere"},
			kind: publish.Terminal, code: outboxtype.CodeTargetRejected},
		{name: "400 ignores retry-after", status: 400, header: map[string]string{"Retry-After": "30"},
			kind: publish.Terminal, code: outboxtype.CodeTargetRejected},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var elsewhere atomic.Int64
			srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/elsewhere" {
					elsewhere.Add(1)
					return
				}
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				fmt.Fprintf(w, "answer %d", tc.status)
			})
			p := newTestPublisher(t, srv.URL+"/hook", nil)
			fixedClock(p, clock)
			r := publishOneMessage(t, p, testMessage())

			if r.Kind != tc.kind || r.Code != tc.code || r.RetryAfter != tc.retryAfter {
				t.Fatalf("got %s %q retry-after %s (%v), want %s %q retry-after %s",
					r.Kind, r.Code, r.RetryAfter, r.Err, tc.kind, tc.code, tc.retryAfter)
			}
			if tc.kind == publish.Delivered {
				if r.TargetRef != tc.ref || r.Err != nil {
					t.Errorf("delivered with ref %q, err %v; want ref %q", r.TargetRef, r.Err, tc.ref)
				}
				return
			}
			var se *StatusError
			if !errors.As(r.Err, &se) || se.StatusCode != tc.status {
				t.Fatalf("error %v is not a StatusError for %d", r.Err, tc.status)
			}
			if want := fmt.Sprintf("answer %d", tc.status); se.Body != want || !strings.Contains(r.Err.Error(), want) {
				t.Errorf("error %q, body %q: want the body %q in it", r.Err, se.Body, want)
			}
			if !strings.Contains(r.Err.Error(), strconv.Itoa(tc.status)) {
				t.Errorf("error %q does not name the status", r.Err)
			}
			if tc.status >= 300 && tc.status < 400 {
				if !strings.Contains(r.Err.Error(), "redirects are not followed") || se.Location != "/elsewhere" {
					t.Errorf("redirect error %q (location %q) does not say it was not followed, and where to", r.Err, se.Location)
				}
				if n := elsewhere.Load(); n != 0 {
					t.Errorf("the redirect was followed (%d requests)", n)
				}
			}
			if n := len(srv.seen()); n != 1 {
				t.Errorf("%d requests, want 1", n)
			}
		})
	}
}

func TestRedirectNotFollowedWithAGivenClient(t *testing.T) {
	t.Parallel()
	var followed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			followed.Add(1)
			return
		}
		http.Redirect(w, r, "/moved", http.StatusFound)
	}))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{}} // follows redirects, as http.Client does by default
	p, err := New(client, Config{URL: srv.URL, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.CloseIdleConnections)
	r := publishOneMessage(t, p, testMessage())
	if r.Kind != publish.Terminal || r.Code != outboxtype.CodeTargetRejected {
		t.Errorf("got %s %s %v, want terminal TARGET_REJECTED", r.Kind, r.Code, r.Err)
	}
	if followed.Load() != 0 {
		t.Error("the signed request was sent to the redirect's target")
	}
	if client.CheckRedirect != nil {
		t.Error("New changed the caller's client")
	}
}

func TestDroppedConnectionIsRetryableNetwork(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		conn.Close()
	}))
	t.Cleanup(srv.Close)
	p := newTestPublisher(t, srv.URL, nil)
	r := publishOneMessage(t, p, testMessage())
	if r.Kind != publish.Retryable || r.Code != outboxtype.CodeNetwork || r.Err == nil {
		t.Errorf("got %s %s %v, want retryable NETWORK", r.Kind, r.Code, r.Err)
	}
}

func TestConnectionRefusedIsRetryableNetwork(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	p := newTestPublisher(t, "http://"+addr+"/hook?token=s3cr3t", nil)
	r := publishOneMessage(t, p, testMessage())
	if r.Kind != publish.Retryable || r.Code != outboxtype.CodeNetwork {
		t.Fatalf("got %s %s %v, want retryable NETWORK", r.Kind, r.Code, r.Err)
	}
	if strings.Contains(r.Err.Error(), "s3cr3t") {
		t.Errorf("the error %q repeats the URL's query", r.Err)
	}
	if !strings.Contains(r.Err.Error(), addr+"/hook") {
		t.Errorf("the error %q does not name the target", r.Err)
	}
}

func TestUntrustedCertificateIsRetryableNetworkAndSaysSo(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	p := newTestPublisher(t, srv.URL, nil) // the built client does not trust the test CA
	r := publishOneMessage(t, p, testMessage())
	if r.Kind != publish.Retryable || r.Code != outboxtype.CodeNetwork {
		t.Fatalf("got %s %s %v, want retryable NETWORK", r.Kind, r.Code, r.Err)
	}
	if !isCertificateError(r.Err) || !strings.Contains(r.Err.Error(), "certificate was rejected") {
		t.Errorf("error %q does not say the certificate was rejected", r.Err)
	}

	// The same target, with a client that trusts it, delivers.
	trusting := srv.Client()
	p2, err := New(trusting, Config{URL: srv.URL, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	if r := publishOneMessage(t, p2, testMessage()); r.Kind != publish.Delivered {
		t.Errorf("with a trusting client: %s %s %v, want delivered", r.Kind, r.Code, r.Err)
	}
}

func TestTimeoutIsRetryableWithinTheConfiguredTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	const timeout = 150 * time.Millisecond
	p := newTestPublisher(t, srv.URL, func(c *Config) { c.Timeout = timeout })

	start := time.Now()
	results := p.Publish(t.Context(), publishtest.Messages(3, 64))
	took := time.Since(start)
	for i, r := range results {
		if r.Kind != publish.Retryable || r.Code != outboxtype.CodeTimeout {
			t.Errorf("message %d: %s %s %v, want retryable TIMEOUT", i, r.Kind, r.Code, r.Err)
		} else if !strings.Contains(r.Err.Error(), "no answer within 150ms") {
			t.Errorf("message %d: error %q does not say how long it waited", i, r.Err)
		}
	}
	// The server never answers before the test ends: Publish returning at
	// all is the timeout at work, and no sooner than it.
	if took < timeout {
		t.Errorf("Publish took %s with a %s timeout", took, timeout)
	}
}

func TestCallerContextEndingIsCanceled(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a hang-up only once the body is read
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	p := newTestPublisher(t, srv.URL, nil)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-arrived; cancel() }()
	r := p.Publish(ctx, []*outboxtype.Message{testMessage()})[0]
	if r.Kind != publish.Retryable || r.Code != outboxtype.CodeCanceled {
		t.Errorf("got %s %s %v, want retryable CANCELED", r.Kind, r.Code, r.Err)
	}
}

// A producer's header that a receiver (or a proxy in front of it) would
// trust as HTTP — a credential, a session, a claimed client address, a
// method override — never goes on the wire, even on a row stored before the
// producer rules refused it: the signature does not cover headers, so only
// the signed body's copy may carry it.
func TestProducerHeadersAReceiverWouldTrustAreNotSent(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {})
	p := newTestPublisher(t, srv.URL, nil)
	m := testMessage()
	m.Headers = map[string]string{
		"Authorization":          "Bearer forged-by-producer",
		"Cookie":                 "session=forged",
		"X-Forwarded-For":        "10.0.0.1",
		"X-HTTP-Method-Override": "DELETE",
		"X-Tenant":               "t-1",
	}
	if r := publishOneMessage(t, p, m); r.Kind != publish.Delivered {
		t.Fatalf("%s %s %v", r.Kind, r.Code, r.Err)
	}
	seen := srv.seen()
	if len(seen) != 1 {
		t.Fatalf("%d requests, want 1", len(seen))
	}
	h := seen[0].header
	for _, name := range []string{"Authorization", "Cookie", "X-Forwarded-For", "X-Http-Method-Override"} {
		if v := h.Get(name); v != "" {
			t.Errorf("header %s = %q was sent", name, v)
		}
	}
	if h.Get("X-Tenant") != "t-1" {
		t.Errorf("an ordinary producer header was dropped: %v", h)
	}
	var env publish.Envelope
	if err := json.Unmarshal(seen[0].body, &env); err != nil || env.Headers["Authorization"] != "Bearer forged-by-producer" {
		t.Errorf("the signed envelope lost the producer's headers: %v %v", env.Headers, err)
	}
}

func TestRequestIsSignedAndKeyed(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {})
	p := newTestPublisher(t, srv.URL, func(c *Config) {
		c.Headers = map[string]string{"Authorization": "Bearer route-token", "X-Route": "billing"}
		c.UserAgent = "billing-dispatcher/1"
	})
	sentAt := time.Now().Truncate(time.Second)
	fixedClock(p, sentAt)

	m := testMessage()
	m.TraceHeader = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	m.Headers = map[string]string{
		"x-tenant":          "t-1",
		"authorization":     "Bearer producer-says", // the route's wins
		"webhook-id":        "forged",               // the protocol's wins
		"content-type":      "text/plain",
		"connection":        "close",
		"bad header":        "dropped: not a token",
		"x-newline":         "dropped\r\ninjected: yes",
		"idempotency-key":   "forged",
		"x-amzn-trace-id":   "Root=forged",
		"transfer-encoding": "chunked",
	}
	for attempt := 1; attempt <= 2; attempt++ {
		m.Attempt = attempt
		if r := publishOneMessage(t, p, m); r.Kind != publish.Delivered {
			t.Fatalf("attempt %d: %s %s %v", attempt, r.Kind, r.Code, r.Err)
		}
	}
	seen := srv.seen()
	if len(seen) != 2 {
		t.Fatalf("%d requests, want 2", len(seen))
	}
	verifier, _ := standardwebhooks.NewWebhookRaw(testSecret)
	for i, req := range seen {
		h := req.header
		if err := verifier.Verify(req.body, h); err != nil {
			t.Errorf("attempt %d: the signature does not verify with the library: %v", i+1, err)
		}
		want := map[string]string{
			"Webhook-Id":        m.StableKey(),
			"Idempotency-Key":   m.StableKey(),
			"Webhook-Timestamp": strconv.FormatInt(sentAt.Unix(), 10),
			"Content-Type":      "application/json",
			"User-Agent":        "billing-dispatcher/1",
			"Authorization":     "Bearer route-token",
			"X-Route":           "billing",
			"X-Tenant":          "t-1",
			"X-Amzn-Trace-Id":   m.TraceHeader,
		}
		for name, value := range want {
			if got := h.Values(name); len(got) != 1 || got[0] != value {
				t.Errorf("attempt %d: %s = %q, want %q", i+1, name, got, value)
			}
		}
		for _, name := range []string{"Bad header", "X-Newline", "Injected", "Connection"} {
			if v := h.Get(name); v != "" {
				t.Errorf("attempt %d: header %s = %q was sent", i+1, name, v)
			}
		}
		var env publish.Envelope
		if err := json.Unmarshal(req.body, &env); err != nil {
			t.Fatalf("the body is not an envelope: %v", err)
		}
		if env.Key != m.StableKey() || env.ID != m.ID.String() || env.Attempt != i+1 {
			t.Errorf("attempt %d: envelope key %q id %q attempt %d", i+1, env.Key, env.ID, env.Attempt)
		}
		if env.Headers["bad header"] != "dropped: not a token" || env.Headers["webhook-id"] != "forged" {
			t.Errorf("attempt %d: the envelope lost headers that HTTP could not carry: %v", i+1, env.Headers)
		}
	}
	if seen[0].header.Get("Webhook-Id") != seen[1].header.Get("Webhook-Id") {
		t.Error("the webhook-id changed between attempts")
	}

	// The signature binds the body and the secret.
	req := seen[0]
	tampered := bytes.Replace(req.body, []byte(`"attempt":1`), []byte(`"attempt":9`), 1)
	if bytes.Equal(tampered, req.body) {
		t.Fatal("the test did not tamper with the body")
	}
	if err := verifier.Verify(tampered, req.header); !errors.Is(err, standardwebhooks.ErrNoMatchingSignature) {
		t.Errorf("a tampered body verified: %v", err)
	}
	other, _ := standardwebhooks.NewWebhookRaw([]byte("another secret entirely, 32 byte"))
	if err := other.Verify(req.body, req.header); !errors.Is(err, standardwebhooks.ErrNoMatchingSignature) {
		t.Errorf("another secret verified the signature: %v", err)
	}
	// A receiver configured with the whsec_ form of the secret verifies it.
	fromString, err := standardwebhooks.NewWebhook("whsec_" + base64.StdEncoding.EncodeToString(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	if err := fromString.Verify(req.body, req.header); err != nil {
		t.Errorf("the whsec_ form of the secret does not verify: %v", err)
	}
}

func TestWebhookIDIsTheIDWithoutADedupeKey(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {})
	p := newTestPublisher(t, srv.URL, nil)
	m := testMessage()
	m.DedupeKey = ""
	publishOneMessage(t, p, m)
	if got := srv.seen()[0].header.Get("Webhook-Id"); got != m.ID.String() {
		t.Errorf("webhook-id %q, want the message id %s", got, m.ID)
	}
}

func TestNoTraceHeaderWithoutATrace(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {})
	p := newTestPublisher(t, srv.URL, nil)
	publishOneMessage(t, p, testMessage())
	if got := srv.seen()[0].header.Values("X-Amzn-Trace-Id"); len(got) != 0 {
		t.Errorf("X-Amzn-Trace-Id %q sent for a message without a trace", got)
	}
}

func TestErrorBodySnippetIsBoundedAndPrintable(t *testing.T) {
	t.Parallel()
	body := "first line\r\n\x00\x1b[31m" + string([]byte{0xff, 0xfe}) + "\tred " + strings.Repeat("é", 4000)
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, body)
	})
	p := newTestPublisher(t, srv.URL, nil)
	r := publishOneMessage(t, p, testMessage())
	var se *StatusError
	if !errors.As(r.Err, &se) {
		t.Fatalf("error %v is not a StatusError", r.Err)
	}
	if len(se.Body) > 512 || !utf8.ValidString(se.Body) || !strings.HasSuffix(se.Body, "…") {
		t.Errorf("snippet of %d bytes, valid UTF-8 %t: %q", len(se.Body), utf8.ValidString(se.Body), se.Body)
	}
	if !strings.HasPrefix(se.Body, "first line \uFFFD\uFFFD[31m\uFFFD\uFFFD red éé") {
		t.Errorf("snippet %q", se.Body)
	}
	for _, r := range se.Body {
		if r < ' ' {
			t.Fatalf("snippet keeps control character %q", r)
		}
	}
}

func TestOversizeAndInvalidPayloadsAreNeverSent(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {})
	const maxBody = 1024
	p := newTestPublisher(t, srv.URL, func(c *Config) { c.MaxPayloadBytes = maxBody })

	payloadOver := publishtest.Message(0, maxBody+1)
	envelopeOver := publishtest.Message(1, maxBody-50) // fits, but not with the envelope around it
	invalid := publishtest.Message(2, 64)
	invalid.Payload = []byte(`{"unterminated":`)
	fits := publishtest.Message(3, 64)

	results := p.Publish(t.Context(), []*outboxtype.Message{payloadOver, envelopeOver, invalid, fits})
	for i, want := range []outboxtype.Code{outboxtype.CodePayloadTooLarge, outboxtype.CodePayloadTooLarge, outboxtype.CodeInvalidPayload} {
		if r := results[i]; r.Kind != publish.Terminal || r.Code != want || r.Err == nil {
			t.Errorf("message %d: %s %s %v, want terminal %s", i, r.Kind, r.Code, r.Err, want)
		}
	}
	if results[3].Kind != publish.Delivered {
		t.Errorf("message 3: %s %s %v, want delivered", results[3].Kind, results[3].Code, results[3].Err)
	}
	if n := len(srv.seen()); n != 1 {
		t.Errorf("%d requests, want 1 (only the message that fits)", n)
	}
}

func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	var inFlight, peak atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(15 * time.Millisecond)
		inFlight.Add(-1)
	}))
	t.Cleanup(srv.Close)
	const concurrency = 5
	p := newTestPublisher(t, srv.URL, func(c *Config) { c.Concurrency = concurrency })
	results := p.Publish(t.Context(), publishtest.Messages(40, 64))
	for i, r := range results {
		if r.Kind != publish.Delivered {
			t.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}
	if got := peak.Load(); got != concurrency {
		t.Errorf("peak of %d requests in flight, want exactly Concurrency = %d", got, concurrency)
	}
}

// TestConnectionsAreReused counts the connections the server accepts: a
// client that failed to drain or close bodies, or kept too few idle
// connections, would open new ones.
func TestConnectionsAreReused(t *testing.T) {
	t.Parallel()
	var opened atomic.Int64
	var n atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) % 4 {
		case 1: // an error with a body longer than the snippet: must be drained
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, strings.Repeat("x", 4<<10))
		case 2:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			fmt.Fprint(w, `{"ok":true}`)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	const concurrency = 4
	p := newTestPublisher(t, srv.URL, func(c *Config) { c.Concurrency = concurrency })

	for range 10 { // sequential calls
		checkAllAnswered(t, p.Publish(t.Context(), publishtest.Messages(37, 256)))
	}
	var wg sync.WaitGroup
	for range 3 { // concurrent calls
		wg.Go(func() {
			for range 5 {
				checkAllAnswered(t, p.Publish(t.Context(), publishtest.Messages(23, 256)))
			}
		})
	}
	wg.Wait()
	if got := opened.Load(); got > concurrency {
		t.Errorf("the server accepted %d connections for %d requests, want at most Concurrency = %d", got, n.Load(), concurrency)
	}
}

func checkAllAnswered(t *testing.T, results []publish.Result) {
	t.Helper()
	for i, r := range results {
		if r.Code == outboxtype.CodeNetwork || r.Code == outboxtype.CodeTimeout || r.Kind == 0 {
			t.Errorf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no url", Config{Secret: testSecret}, "url is required"},
		{"relative url", Config{URL: "/hook", Secret: testSecret}, "absolute http or https"},
		{"other scheme", Config{URL: "ftp://example.com/x", Secret: testSecret}, "absolute http or https"},
		{"no secret", Config{URL: "https://example.com"}, "secret is required"},
		{"negative timeout", Config{URL: "https://example.com", Secret: testSecret, Timeout: -time.Second}, "timeout"},
		{"negative concurrency", Config{URL: "https://example.com", Secret: testSecret, Concurrency: -1}, "concurrency"},
		{"negative cap", Config{URL: "https://example.com", Secret: testSecret, MaxPayloadBytes: -1}, "max_payload_bytes"},
		{"reserved header", Config{URL: "https://example.com", Secret: testSecret, Headers: map[string]string{"webhook-signature": "x"}}, "set by the publisher"},
		{"bad header name", Config{URL: "https://example.com", Secret: testSecret, Headers: map[string]string{"a b": "x"}}, "not a valid header name"},
		{"bad header value", Config{URL: "https://example.com", Secret: testSecret, Headers: map[string]string{"X-A": "a\nb"}}, "not a valid header value"},
		{"credentials not echoed", Config{URL: "ftp://user:hunter2@example.com", Secret: testSecret}, "absolute http or https"},
	}
	for _, tc := range cases {
		_, err := New(nil, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: error %q repeats the URL's password", tc.name, err)
		}
	}
	p, err := New(nil, Config{URL: "https://example.com/hook", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	if p.timeout != DefaultTimeout || p.maxBody != DefaultMaxPayloadBytes || p.batcher.Concurrency != DefaultConcurrency ||
		p.staticHdr.Get("User-Agent") != DefaultUserAgent {
		t.Errorf("defaults not applied: %+v", p)
	}
	transport := p.client.Transport.(*http.Transport)
	if transport.MaxIdleConnsPerHost < DefaultConcurrency || transport.TLSClientConfig.MinVersion < tls.VersionTLS12 {
		t.Errorf("built client: MaxIdleConnsPerHost %d, TLS min %x", transport.MaxIdleConnsPerHost, transport.TLSClientConfig.MinVersion)
	}
}

func TestAPanicCostsOneMessageNotTheProcess(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {})
	p := newTestPublisher(t, srv.URL, nil)
	msgs := publishtest.Messages(6, 64)
	msgs[2] = nil // a bug upstream
	results := p.Publish(t.Context(), msgs)
	for i, r := range results {
		if i == 2 {
			if r.Kind != publish.Retryable || !strings.Contains(fmt.Sprint(r.Err), "panic") {
				t.Errorf("nil message: %s %s %v, want retryable naming the panic", r.Kind, r.Code, r.Err)
			}
		} else if r.Kind != publish.Delivered {
			t.Errorf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}
}

// writeCountingConn counts the writes made to a connection: each is a
// system call and, without Nagle's delay, a TCP segment.
type writeCountingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCountingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// A request of a few KiB, headers and body, goes out in one write; with
// net/http's default buffer of 4 KiB a body past about 3.5 KiB took two.
func TestARequestOfAFewKiBGoesOutInOneWrite(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	t.Cleanup(srv.Close)
	var writes atomic.Int64
	client := NewHTTPClient(1)
	transport := client.Transport.(*http.Transport)
	dial := transport.DialContext
	transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCountingConn{Conn: c, writes: &writes}, nil
	}
	p, err := New(client, Config{URL: srv.URL, Secret: []byte("whsec-test-secret-32-bytes-long!")})
	if err != nil {
		t.Fatal(err)
	}
	const requests = 5
	for i, r := range p.Publish(context.Background(), publishtest.Messages(requests, 16<<10)) {
		if r.Kind != publish.Delivered {
			t.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
		}
	}
	if got := writes.Load(); got != requests {
		t.Errorf("%d writes for %d requests of 16 KiB, want one a request", got, requests)
	}
}
