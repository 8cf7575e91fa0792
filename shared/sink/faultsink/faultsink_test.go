package faultsink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/sink"
	"github.com/outboxkit/dispatcher/shared/sink/faultsink"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// bench is one fault-injecting receiver under test: the faults it injects
// are set per call, by webhook-id; what its handler ran for and what it
// observed are kept.
type bench struct {
	url    string
	dedupe *sink.MemoryDeduper

	mu       sync.Mutex
	faults   map[string]faultsink.Fault
	handled  []faultsink.Call // CallFrom as the handler saw it
	outcomes []faultsink.Outcome
}

func newBench(t *testing.T, stallFor time.Duration) *bench {
	t.Helper()
	b := &bench{dedupe: sink.NewMemoryDeduper(), faults: map[string]faultsink.Fault{}}
	handle := func(ctx context.Context, env publish.Envelope) error {
		c, _ := faultsink.CallFrom(ctx)
		b.mu.Lock()
		defer b.mu.Unlock()
		b.handled = append(b.handled, c)
		return ctx.Err() // a late handler must not find its context cancelled
	}
	r := faultsink.New(testSecret, b.dedupe, handle, faultsink.Config{
		Pick: func(c faultsink.Call) faultsink.Fault {
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.faults[c.Envelope.Key]
		},
		StallFor: stallFor,
		Observe: func(o faultsink.Outcome) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.outcomes = append(b.outcomes, o)
		},
	}, sink.WithLogger(slog.New(slog.DiscardHandler)))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

func (b *bench) inject(key string, f faultsink.Fault) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.faults[key] = f
}

func (b *bench) seen() ([]faultsink.Call, []faultsink.Outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]faultsink.Call(nil), b.handled...), append([]faultsink.Outcome(nil), b.outcomes...)
}

// delivery is m signed as the dispatcher signs it, now.
func delivery(t *testing.T, url string, m *outboxtype.Message) (*http.Request, string) {
	t.Helper()
	body, err := publish.EncodeEnvelope(m)
	if err != nil {
		t.Fatal(err)
	}
	id, now := m.StableKey(), time.Now()
	signer, _ := standardwebhooks.NewWebhookRaw(testSecret)
	signature, err := signer.Sign(id, now, body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(standardwebhooks.HeaderWebhookID, id)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, signature)
	return req, id
}

type answer struct {
	status     int
	retryAfter string
	Status     string `json:"status"`
	Error      string `json:"error"`
}

func send(t *testing.T, client *http.Client, req *http.Request) (answer, error) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, &a); err != nil {
		t.Errorf("answer %d is not the receiver's JSON: %q", resp.StatusCode, body)
	}
	return a, nil
}

// A fault that answers in the receiver's place sends the dispatcher the
// status it classifies (5xx and 429 retried, 4xx dead-lettered) and leaves
// the webhook-id free: the next delivery is handled, not a duplicate.
func TestFaultsAnsweredInsteadOfTheReceiverLeaveTheDeliveryUnhandled(t *testing.T) {
	t.Parallel()
	cases := []struct {
		fault          faultsink.Fault
		status         int
		answer, header string
	}{
		{faultsink.Fault{Kind: faultsink.Fail}, http.StatusServiceUnavailable, "retry", ""},
		{faultsink.Fault{Kind: faultsink.Fail, Status: http.StatusBadGateway}, http.StatusBadGateway, "retry", ""},
		{faultsink.Fault{Kind: faultsink.Fail, Status: http.StatusConflict}, http.StatusConflict, "rejected", ""},
		{faultsink.Fault{Kind: faultsink.Throttle, RetryAfter: 1500 * time.Millisecond}, http.StatusTooManyRequests, "retry", "2"},
		{faultsink.Fault{Kind: faultsink.Throttle}, http.StatusTooManyRequests, "retry", ""},
	}
	b := newBench(t, time.Second)
	for i, c := range cases {
		m := publishtest.Message(i, 64)
		req, id := delivery(t, b.url, m)
		b.inject(id, c.fault)
		got, err := send(t, http.DefaultClient, req)
		if err != nil {
			t.Fatal(err)
		}
		if got.status != c.status || got.Status != c.answer || got.retryAfter != c.header || got.Error == "" {
			t.Errorf("%+v answered %d %q (Retry-After %q, error %q), want %d %q (Retry-After %q) with a reason",
				c.fault, got.status, got.Status, got.retryAfter, got.Error, c.status, c.answer, c.header)
		}
		if b.dedupe.Handled(id) {
			t.Errorf("%+v: the webhook-id was recorded as handled", c.fault)
		}
		b.inject(id, faultsink.Fault{})
		req, _ = delivery(t, b.url, m)
		if again, _ := send(t, http.DefaultClient, req); again.status != http.StatusOK || again.Status != "delivered" {
			t.Errorf("%+v: the next delivery answered %d %q, want 200 delivered", c.fault, again.status, again.Status)
		}
	}
	handled, outcomes := b.seen()
	if len(handled) != len(cases) {
		t.Errorf("the handler ran %d times for %d messages, each delivered once without a fault", len(handled), len(cases))
	}
	if len(outcomes) != 2*len(cases) {
		t.Fatalf("observed %d answers to %d calls", len(outcomes), 2*len(cases))
	}
	for i, c := range cases {
		if o := outcomes[2*i]; o.Fault != c.fault || o.Status != c.status || o.Answer != c.answer || o.Envelope.Key == "" {
			t.Errorf("observed %+v for the call %+v answered", o, c.fault)
		}
	}
}

// LoseAnswer: the delivery takes effect but its sender is told 503; the
// delivery that follows is answered duplicate, without running the handler
// again — what the demo shows as receiver-side deduplication.
func TestLoseAnswerHandlesTheDeliveryAndTheRetryIsADuplicate(t *testing.T) {
	t.Parallel()
	b := newBench(t, time.Second)
	m := publishtest.Message(0, 64)
	req, id := delivery(t, b.url, m)
	b.inject(id, faultsink.Fault{Kind: faultsink.LoseAnswer})
	if got, _ := send(t, http.DefaultClient, req); got.status != http.StatusServiceUnavailable || got.Status != "retry" {
		t.Errorf("the call whose answer is lost answered %d %q, want 503 retry", got.status, got.Status)
	}
	if !b.dedupe.Handled(id) {
		t.Error("the call whose answer is lost was not recorded as handled")
	}
	req, _ = delivery(t, b.url, m)
	if got, _ := send(t, http.DefaultClient, req); got.status != http.StatusOK || got.Status != "duplicate" {
		t.Errorf("the delivery again, still with LoseAnswer, answered %d %q, want 200 duplicate (only a delivered 200 is lost)", got.status, got.Status)
	}
	handled, outcomes := b.seen()
	if len(handled) != 1 || handled[0].Fault.Kind != faultsink.LoseAnswer || handled[0].Envelope.Key != id {
		t.Errorf("the handler ran for %+v, want once, seeing its call and fault through CallFrom", handled)
	}
	if len(outcomes) != 2 || !outcomes[0].AnswerLost || outcomes[0].Status != http.StatusOK ||
		outcomes[1].AnswerLost || !outcomes[1].Duplicate {
		t.Errorf("observed %+v, want a lost 200 then a duplicate", outcomes)
	}
}

// The two timeouts the soak counts apart: a stalled call is never
// processed; a late one is processed, and committed, after its sender gave
// up (its handler's context still live), so its retry is a duplicate.
func TestStallAndHandleLateBothTimeOutButOnlyTheLateOneTakesEffect(t *testing.T) {
	t.Parallel()
	// The client gives up before the server even starts holding the call:
	// the order of the two does not depend on the machine's speed.
	const stallFor = 300 * time.Millisecond
	client := &http.Client{Timeout: stallFor / 6}
	b := newBench(t, stallFor)

	stalledMsg, lateMsg := publishtest.Message(0, 64), publishtest.Message(1, 64)
	stalled, stalledID := delivery(t, b.url, stalledMsg)
	late, lateID := delivery(t, b.url, lateMsg)
	b.inject(stalledID, faultsink.Fault{Kind: faultsink.Stall})
	b.inject(lateID, faultsink.Fault{Kind: faultsink.HandleLate})
	for _, req := range []*http.Request{stalled, late} {
		if got, err := send(t, client, req); err == nil {
			t.Errorf("%s was answered %d %q within the client's timeout", req.Header.Get("webhook-id"), got.status, got.Status)
		}
	}
	// The late handler commits after its sender left: wait for it.
	deadline := time.Now().Add(time.Minute)
	for !b.dedupe.Handled(lateID) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !b.dedupe.Handled(lateID) {
		t.Fatal("the late call was never recorded as handled")
	}
	if b.dedupe.Handled(stalledID) {
		t.Error("the stalled call was recorded as handled")
	}
	b.inject(stalledID, faultsink.Fault{})
	b.inject(lateID, faultsink.Fault{})
	for _, retry := range []struct {
		m    *outboxtype.Message
		want string
	}{{stalledMsg, "delivered"}, {lateMsg, "duplicate"}} {
		req, id := delivery(t, b.url, retry.m)
		if got, _ := send(t, http.DefaultClient, req); got.status != http.StatusOK || got.Status != retry.want {
			t.Errorf("the retry of %s answered %d %q, want 200 %s", id, got.status, got.Status, retry.want)
		}
	}
	handled, _ := b.seen()
	if len(handled) != 2 {
		t.Errorf("the handler ran %d times, want twice: the late call and the stalled one's retry", len(handled))
	}
	for _, c := range handled {
		if c.Envelope.Key == lateID && c.Fault.Kind != faultsink.HandleLate {
			t.Errorf("the late call's handler saw fault %v", c.Fault.Kind)
		}
	}
}

// Forgeries are the receiver's to refuse: a passed call with a bad
// signature gets the receiver's 401, observed as such.
func TestPassedCallsGetTheReceiversAnswer(t *testing.T) {
	t.Parallel()
	b := newBench(t, time.Second)
	req, _ := delivery(t, b.url, publishtest.Message(0, 64))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, "v1,AAAA")
	if got, _ := send(t, http.DefaultClient, req); got.status != http.StatusUnauthorized || got.Status != "rejected" {
		t.Errorf("a forged call answered %d %q, want the receiver's 401 rejected", got.status, got.Status)
	}
	if handled, outcomes := b.seen(); len(handled) != 0 || len(outcomes) != 1 || outcomes[0].Status != http.StatusUnauthorized {
		t.Errorf("handled %+v, observed %+v", handled, outcomes)
	}
}
