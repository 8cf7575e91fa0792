package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
)

// ceReceiver parses every request with the CloudEvents SDK and verifies
// its Standard Webhooks signature, as a receiver of format cloudevents does.
type ceReceiver struct {
	mu     sync.Mutex
	events []*cloudevents.Event
	bodies [][]byte
	header []http.Header
}

func newCEReceiver(t *testing.T) (*ceReceiver, *httptest.Server) {
	t.Helper()
	verifier, err := standardwebhooks.NewWebhookRaw(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	rec := &ceReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := readAll(r)
		if err := verifier.Verify(body, r.Header); err != nil {
			t.Errorf("the signature does not verify: %v", err)
		}
		r.Body = readCloser{bytes.NewReader(body)}
		ev, err := cehttp.NewEventFromHTTPRequest(r)
		if err != nil {
			t.Errorf("the SDK cannot read the request: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rec.mu.Lock()
		rec.events, rec.bodies, rec.header = append(rec.events, ev), append(rec.bodies, body), append(rec.header, r.Header.Clone())
		rec.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return rec, srv
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func ceEncoder(t *testing.T, source string) *cloudevent.Encoder {
	t.Helper()
	e, err := cloudevent.New(source)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// A route of format cloudevents posts the payload unchanged, its attributes
// as ce-* headers the SDK reads back, still signed, the webhook-id the
// event's id; a producer's header cannot stand in for an attribute.
func TestCloudEventsBinaryMode(t *testing.T) {
	t.Parallel()
	rec, srv := newCEReceiver(t)
	p := newTestPublisher(t, srv.URL, func(c *Config) { c.CloudEvents = ceEncoder(t, "") })
	m := testMessage()
	m.OrderingKey, m.SequenceID = "account-7", 42
	m.Payload = json.RawMessage(`{"amount": 9900, "currency": "EUR"}`)
	m.CreatedAt = time.Date(2026, 11, 28, 10, 5, 1, 123456000, time.UTC)
	// A row stored before ce-* was reserved: ours must win, theirs not be sent.
	m.Headers = map[string]string{"x-request-id": "r-1", "ce-source": "/forged", "Ce-Type": "forged"}
	if r := publishOneMessage(t, p, m); r.Kind != publish.Delivered {
		t.Fatalf("%s %s %v", r.Kind, r.Code, r.Err)
	}
	if len(rec.events) != 1 {
		t.Fatalf("%d events, want 1", len(rec.events))
	}
	ev, body, h := rec.events[0], rec.bodies[0], rec.header[0]
	if err := ev.Validate(); err != nil {
		t.Errorf("the event is invalid: %v", err)
	}
	if !bytes.Equal(body, m.Payload) || !bytes.Equal(ev.Data(), m.Payload) {
		t.Errorf("body %s, data %s, want the payload unchanged %s", body, ev.Data(), m.Payload)
	}
	if ev.ID() != m.StableKey() || h.Get("Webhook-Id") != ev.ID() || ev.Source() != "/outbox/conformance" || ev.Type() != "suite" ||
		!ev.Time().Equal(m.CreatedAt) || ev.DataContentType() != "application/json" || ev.SpecVersion() != "1.0" {
		t.Errorf("event %s with webhook-id %q", ev, h.Get("Webhook-Id"))
	}
	ext := ev.Extensions()
	if ext["partitionkey"] != "account-7" || ext["sequence"] != "0000000000000000042" || ext["tenantid"] != "tenant-1" || len(ext) != 3 {
		t.Errorf("extensions %v", ext)
	}
	if h.Values("Ce-Source")[0] != "/outbox/conformance" || len(h.Values("Ce-Source")) != 1 || len(h.Values("Ce-Type")) != 1 {
		t.Errorf("ce-source %q, ce-type %q: a producer's header was sent", h.Values("Ce-Source"), h.Values("Ce-Type"))
	}
	if h.Get("X-Request-Id") != "r-1" {
		t.Errorf("the producer's ordinary header was not sent: %v", h)
	}
}

// A message no reader would take as an event is refused before any call,
// naming why.
func TestCloudEventsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	rec, srv := newCEReceiver(t)
	p := newTestPublisher(t, srv.URL, func(c *Config) { c.CloudEvents = ceEncoder(t, "") })
	m := testMessage()
	m.DedupeKey = "   "
	r := publishOneMessage(t, p, m)
	if r.Kind != publish.Terminal || r.Code != outboxtype.CodeInvalidPayload || r.Err == nil ||
		!bytes.Contains([]byte(r.Err.Error()), []byte("webhook: encode the CloudEvent: cloudevent: the dedupe key is only white space")) {
		t.Errorf("%s %s %v, want a terminal INVALID_PAYLOAD naming the dedupe key", r.Kind, r.Code, r.Err)
	}
	if len(rec.events) != 0 {
		t.Errorf("%d requests were sent", len(rec.events))
	}
}
