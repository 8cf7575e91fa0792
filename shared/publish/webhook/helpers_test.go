package webhook

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// testSecret is the raw signing key every test signs with.
var testSecret = []byte("0123456789abcdef0123456789abcdef")

// newTestPublisher builds a Publisher for url with the test secret;
// configure adjusts the configuration first.
func newTestPublisher(t testing.TB, url string, configure func(*Config)) *Publisher {
	t.Helper()
	cfg := Config{URL: url, Secret: testSecret, Concurrency: 4}
	if configure != nil {
		configure(&cfg)
	}
	p, err := New(nil, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(p.client.CloseIdleConnections)
	return p
}

// captured is one request a server saw.
type captured struct {
	header http.Header
	body   []byte
}

// recorder is an httptest server that records every request and answers
// with answer.
type recorder struct {
	*httptest.Server
	mu       sync.Mutex
	requests []captured
}

func newRecorder(t testing.TB, answer http.HandlerFunc) *recorder {
	t.Helper()
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := readAll(r)
		rec.mu.Lock()
		rec.requests = append(rec.requests, captured{header: r.Header.Clone(), body: body})
		rec.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *recorder) seen() []captured {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]captured(nil), rec.requests...)
}

func readAll(r *http.Request) []byte {
	body, _ := io.ReadAll(r.Body)
	return body
}

// publishOneMessage publishes m alone and returns its result.
func publishOneMessage(t testing.TB, p *Publisher, m *outboxtype.Message) publish.Result {
	t.Helper()
	results := p.Publish(t.Context(), []*outboxtype.Message{m})
	if len(results) != 1 {
		t.Fatalf("%d results for one message", len(results))
	}
	return results[0]
}

func testMessage() *outboxtype.Message { return publishtest.Message(0, 64) }

// fixedClock pins the publisher's clock, so Retry-After dates and
// timestamps are exact.
func fixedClock(p *Publisher, at time.Time) { p.now = func() time.Time { return at } }
