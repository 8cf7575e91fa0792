package sink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/sink"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

var quiet = sink.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

// delivery is a signed request as the dispatcher sends it, built with the
// Standard Webhooks library rather than our publisher.
type delivery struct {
	id     string
	at     time.Time
	body   []byte
	secret []byte
}

func newDelivery(t testing.TB, m *outboxtype.Message) delivery {
	t.Helper()
	body, err := publish.EncodeEnvelope(m)
	if err != nil {
		t.Fatal(err)
	}
	return delivery{id: m.StableKey(), at: time.Now(), body: body, secret: testSecret}
}

func (d delivery) request(t testing.TB, url string) *http.Request {
	t.Helper()
	signer, _ := standardwebhooks.NewWebhookRaw(d.secret)
	signature, err := signer.Sign(d.id, d.at, d.body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(d.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(standardwebhooks.HeaderWebhookID, d.id)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(d.at.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, signature)
	return req
}

type reply struct {
	status    int
	header    http.Header
	answer    map[string]string
	duplicate bool
}

func send(t testing.TB, req *http.Request) reply {
	t.Helper()
	// Errorf, not Fatalf: senders run in goroutines too.
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("send: %v", err)
		return reply{}
	}
	defer resp.Body.Close()
	var answer map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Errorf("answer (HTTP %d) is not JSON: %v", resp.StatusCode, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, answer: answer, duplicate: resp.Header.Get(sink.DuplicateHeader) == "true"}
}

// counter is a handler that records what it handled.
type counter struct {
	mu   sync.Mutex
	envs []publish.Envelope
	err  error
}

func (c *counter) handle(_ context.Context, env publish.Envelope) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	c.envs = append(c.envs, env)
	return nil
}

func (c *counter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.envs)
}

func (c *counter) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
}

func serve(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestGoodDeliveryIsHandled(t *testing.T) {
	t.Parallel()
	c := &counter{}
	url := serve(t, sink.NewReceiver(testSecret, sink.NewMemoryDeduper(), c.handle, quiet))
	m := publishtest.Message(0, 128)
	got := send(t, newDelivery(t, m).request(t, url))
	if got.status != http.StatusOK || got.answer["status"] != "delivered" || got.duplicate {
		t.Fatalf("answer %d %v (duplicate %t), want 200 delivered", got.status, got.answer, got.duplicate)
	}
	if c.count() != 1 {
		t.Fatalf("the handler ran %d times", c.count())
	}
	env := c.envs[0]
	if env.Key != m.StableKey() || env.ID != m.ID.String() || env.Namespace != m.Namespace || string(env.Payload) != string(m.Payload) {
		t.Errorf("the handler got %+v", env)
	}
}

func TestForgedStaleAndMalformedDeliveriesAreRefused(t *testing.T) {
	t.Parallel()
	now := time.Now()
	c := &counter{}
	url := serve(t, sink.NewReceiver(testSecret, sink.NewMemoryDeduper(), c.handle, quiet,
		sink.WithClock(func() time.Time { return now }), sink.WithTolerance(5*time.Minute), sink.WithMaxBodyBytes(4096)))

	good := func() delivery { d := newDelivery(t, publishtest.Message(0, 64)); d.at = now; return d }
	cases := []struct {
		name   string
		req    func() *http.Request
		status int
	}{
		{"missing signature", func() *http.Request {
			r := good().request(t, url)
			r.Header.Del(standardwebhooks.HeaderWebhookSignature)
			return r
		}, 400},
		{"malformed timestamp", func() *http.Request {
			r := good().request(t, url)
			r.Header.Set(standardwebhooks.HeaderWebhookTimestamp, "yesterday")
			return r
		}, 400},
		{"wrong secret", func() *http.Request {
			d := good()
			d.secret = []byte("not the receiver's secret at all")
			return d.request(t, url)
		}, 401},
		{"tampered body", func() *http.Request {
			d := good()
			r := d.request(t, url)
			tampered := bytes.Replace(d.body, []byte(`"attempt":1`), []byte(`"attempt":2`), 1)
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(tampered)), int64(len(tampered))
			return r
		}, 401},
		{"another webhook-id", func() *http.Request {
			r := good().request(t, url)
			r.Header.Set(standardwebhooks.HeaderWebhookID, "another-id")
			return r
		}, 401},
		{"stale timestamp", func() *http.Request { d := good(); d.at = now.Add(-6 * time.Minute); return d.request(t, url) }, 401},
		{"future timestamp", func() *http.Request { d := good(); d.at = now.Add(6 * time.Minute); return d.request(t, url) }, 401},
		{"signed, not JSON", func() *http.Request { d := good(); d.body = []byte("hello"); return d.request(t, url) }, 400},
		{"signed, not an envelope", func() *http.Request { d := good(); d.body = []byte(`{"hello":1}`); return d.request(t, url) }, 400},
		{"key is not the webhook-id", func() *http.Request { d := good(); d.id = "other-key"; return d.request(t, url) }, 400},
		{"no payload", func() *http.Request {
			d := good()
			d.body = bytes.Replace(d.body, []byte(`"payload":`), []byte(`"payload_":`), 1)
			return d.request(t, url)
		}, 400},
		{"too large", func() *http.Request {
			d := newDelivery(t, publishtest.Message(0, 8192))
			d.at = now
			return d.request(t, url)
		}, 413},
		{"not a POST", func() *http.Request { r := good().request(t, url); r.Method = http.MethodPut; return r }, 405},
	}
	for _, tc := range cases {
		got := send(t, tc.req())
		if got.status != tc.status || got.answer["status"] != "rejected" || got.answer["error"] == "" {
			t.Errorf("%s: answer %d %v, want %d rejected with a reason", tc.name, got.status, got.answer, tc.status)
		}
	}
	if c.count() != 0 {
		t.Errorf("the handler ran %d times for refused deliveries", c.count())
	}
	// Within the tolerance either way is fine.
	for _, skew := range []time.Duration{-4 * time.Minute, 4 * time.Minute} {
		d := good()
		d.at = now.Add(skew)
		if got := send(t, d.request(t, url)); got.status != http.StatusOK {
			t.Errorf("skew %s: answer %d %v, want 200", skew, got.status, got.answer)
		}
	}
}

func TestDuplicateDeliveryRunsTheHandlerOnce(t *testing.T) {
	t.Parallel()
	c := &counter{}
	url := serve(t, sink.NewReceiver(testSecret, sink.NewMemoryDeduper(), c.handle, quiet))
	m := publishtest.Message(0, 64)
	first := newDelivery(t, m)
	if got := send(t, first.request(t, url)); got.status != 200 || got.duplicate {
		t.Fatalf("first delivery: %d %v", got.status, got.answer)
	}
	// A retry: a later attempt, freshly signed, same webhook-id.
	m.Attempt = 2
	retry := newDelivery(t, m)
	retry.at = first.at.Add(time.Second)
	got := send(t, retry.request(t, url))
	if got.status != 200 || !got.duplicate || got.answer["status"] != "duplicate" {
		t.Errorf("redelivery: %d %v (duplicate header %t), want 200 duplicate", got.status, got.answer, got.duplicate)
	}
	if c.count() != 1 {
		t.Errorf("the handler ran %d times", c.count())
	}
}

func TestConcurrentDuplicatesRunTheHandlerOnce(t *testing.T) {
	t.Parallel()
	testConcurrentDuplicates(t, sink.NewMemoryDeduper())
}

// testConcurrentDuplicates sends the same delivery from many clients at
// once while the first handler run is held, so the others arrive while the
// id is in flight.
func testConcurrentDuplicates(t *testing.T, d sink.Deduper) {
	t.Helper()
	const senders = 12
	var runs atomic.Int64
	release := make(chan struct{})
	var arrived sync.WaitGroup
	arrived.Add(senders)
	h := func(ctx context.Context, env publish.Envelope) error {
		runs.Add(1)
		<-release
		return nil
	}
	receiver := sink.NewReceiver(testSecret, d, h, quiet)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		receiver.ServeHTTP(w, r)
	}))
	del := newDelivery(t, publishtest.Message(0, 64))
	replies := make(chan reply, senders)
	for range senders {
		go func() { replies <- send(t, del.request(t, url)) }()
	}
	arrived.Wait()
	time.Sleep(50 * time.Millisecond) // let every request reach the deduper
	close(release)
	delivered, duplicates := 0, 0
	for range senders {
		got := <-replies
		switch {
		case got.status == 200 && got.duplicate:
			duplicates++
		case got.status == 200:
			delivered++
		default:
			t.Errorf("answer %d %v", got.status, got.answer)
		}
	}
	if runs.Load() != 1 || delivered != 1 || duplicates != senders-1 {
		t.Errorf("handler runs %d, delivered %d, duplicates %d; want 1, 1, %d", runs.Load(), delivered, duplicates, senders-1)
	}
}

func TestHandlerErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		err        error
		status     int
		retryAfter string
		errorText  string
	}{
		{"plain error: retry", errors.New("db: connection refused to 10.0.0.7"), 500, "", "the handler failed"},
		{"panic: retry", nil, 500, "", "the handler failed"},
		{"reject 409", sink.Reject(http.StatusConflict, errors.New("invoice already void")), 409, "", "invoice already void"},
		{"reject 410", sink.Reject(http.StatusGone, errors.New("customer deleted")), 410, "", "customer deleted"},
		{"reject with a retryable status becomes 422", sink.Reject(http.StatusServiceUnavailable, errors.New("x")), 422, "", "x"},
		{"reject with 429 becomes 422", sink.Reject(http.StatusTooManyRequests, errors.New("x")), 422, "", "x"},
		{"retry later", sink.RetryLater(1500*time.Millisecond, errors.New("ledger locked")), 429, "2", "ledger locked"},
		{"retry later, wrapped", fmt.Errorf("charge: %w", sink.RetryLater(30*time.Second, errors.New("busy"))), 429, "30", "busy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int64
			fail := atomic.Bool{}
			fail.Store(true)
			h := func(ctx context.Context, env publish.Envelope) error {
				runs.Add(1)
				if !fail.Load() {
					return nil
				}
				if tc.err == nil {
					panic("handler bug")
				}
				return tc.err
			}
			url := serve(t, sink.NewReceiver(testSecret, sink.NewMemoryDeduper(), h, quiet))
			d := newDelivery(t, publishtest.Message(0, 64))
			got := send(t, d.request(t, url))
			if got.status != tc.status || got.header.Get("Retry-After") != tc.retryAfter || got.answer["error"] != tc.errorText {
				t.Fatalf("answer %d Retry-After %q %v, want %d Retry-After %q error %q",
					got.status, got.header.Get("Retry-After"), got.answer, tc.status, tc.retryAfter, tc.errorText)
			}
			// A failed delivery is not recorded: the redelivery runs the
			// handler again.
			fail.Store(false)
			if got := send(t, d.request(t, url)); got.status != 200 || got.duplicate {
				t.Errorf("redelivery after a failure: %d %v (duplicate %t), want 200 delivered", got.status, got.answer, got.duplicate)
			}
			if runs.Load() != 2 {
				t.Errorf("the handler ran %d times, want 2", runs.Load())
			}
		})
	}
}

func TestWaitingDuplicateGivesUpWithItsRequest(t *testing.T) {
	t.Parallel()
	d := sink.NewMemoryDeduper()
	_, held, err := d.Begin(t.Context(), "id-1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := d.Begin(ctx, "id-1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a Begin waiting on a held id: %v, want the context's error", err)
	}
	// A rolled-back hold frees the id; a committed one makes it a duplicate.
	if err := held.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, again, err := d.Begin(t.Context(), "id-1")
	if err != nil {
		t.Fatalf("after a rollback: %v", err)
	}
	if err := again.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Begin(t.Context(), "id-1"); !errors.Is(err, sink.ErrDuplicate) {
		t.Errorf("after a commit: %v, want ErrDuplicate", err)
	}
	if !d.Handled("id-1") || d.Handled("id-2") {
		t.Error("Handled disagrees")
	}
}

func TestNewReceiverRefusesToRunUnsafely(t *testing.T) {
	t.Parallel()
	h := func(context.Context, publish.Envelope) error { return nil }
	for name, build := range map[string]func(){
		"no secret":  func() { sink.NewReceiver(nil, sink.NewMemoryDeduper(), h) },
		"no deduper": func() { sink.NewReceiver(testSecret, nil, h) },
		"no handler": func() { sink.NewReceiver(testSecret, sink.NewMemoryDeduper(), nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: NewReceiver did not panic", name)
				}
			}()
			build()
		}()
	}
}

// An offloaded payload is fetched from the envelope's URL and handed to
// the handler as the payload; a fetch that fails (or serves another size)
// is answered 503 without running the handler, and the retry is handled.
func TestOffloadedPayloadIsFetchedForTheHandler(t *testing.T) {
	t.Parallel()
	payload := []byte(`{"invoice":"inv-1","lines":"` + string(bytes.Repeat([]byte("l"), 100_000)) + `"}`)
	var served atomic.Int32
	var serve404 atomic.Bool
	store := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		if serve404.Load() {
			http.NotFound(w, r)
			return
		}
		w.Write(payload)
	}))
	defer store.Close()
	c := &counter{}
	url := serve(t, sink.NewReceiver(testSecret, sink.NewMemoryDeduper(), c.handle, quiet))
	offloaded := func(size int) *outboxtype.Message {
		m := publishtest.Message(0, 10)
		m.Offload = &outboxtype.Offload{Bucket: "b", Key: "k", Size: size, URL: store.URL + "/k", URLExpires: time.Now().Add(time.Hour)}
		return m
	}

	serve404.Store(true)
	m := offloaded(len(payload))
	if got := send(t, newDelivery(t, m).request(t, url)); got.status != http.StatusServiceUnavailable || c.count() != 0 {
		t.Fatalf("a URL answering 404: %d %v, handler ran %d times; want 503 and no run", got.status, got.answer, c.count())
	}
	serve404.Store(false)
	if got := send(t, newDelivery(t, offloaded(len(payload)+1)).request(t, url)); got.status != http.StatusServiceUnavailable || c.count() != 0 {
		t.Fatalf("an object of another size: %d %v, handler ran %d times; want 503 and no run", got.status, got.answer, c.count())
	}
	if got := send(t, newDelivery(t, m).request(t, url)); got.status != http.StatusOK || got.answer["status"] != "delivered" {
		t.Fatalf("the retry: %d %v, want 200 delivered", got.status, got.answer)
	}
	if c.count() != 1 || !bytes.Equal(c.envs[0].Payload, payload) || c.envs[0].Offload == nil {
		t.Fatalf("the handler ran %d times; want once, with the fetched payload", c.count())
	}
	if served.Load() != 3 {
		t.Errorf("the store served %d requests, want 3", served.Load())
	}
}
