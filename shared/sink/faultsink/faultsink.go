// Package faultsink is the reference webhook receiver (package shared/sink)
// behind a fault injector: what `outboxctl demo` and the soak test deliver
// to, so that a run shows retries, throttling, timeouts and receiver-side
// deduplication against the same receiver a plugin author deploys.
//
// Each call's body is read once, decoded, and handed to the caller's Pick,
// which chooses a [Fault]; the call is then answered by the fault, by the
// receiver, or by both (a handled call whose answer is late or lost). Every
// call, whatever happened to it, is reported to Observe once it has been
// answered.
//
//	Pass        the receiver answers                     (what a plugin sees)
//	Fail        Status, not handled                       5xx: retried; 4xx: dead-lettered
//	Throttle    429 + Retry-After, not handled            retried after Retry-After
//	Stall       held StallFor, then 503; not handled      a timeout, never processed
//	HandleLate  handled and committed after StallFor      a timeout that took effect:
//	                                                      the retry is answered duplicate
//	LoseAnswer  handled, its 200 replaced by a 503        the same, without the wait
//
// Faults are picked before the receiver verifies the signature, on an
// envelope nobody has checked yet: this is a test and demo tool, never a
// production receiver.
package faultsink

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/sink"
)

// Kind is what a fault does to a call.
type Kind int

const (
	// Pass hands the call to the receiver and sends its answer.
	Pass Kind = iota
	// Fail answers Fault.Status without handling the call: a 5xx the
	// dispatcher retries, or a 4xx it dead-letters.
	Fail
	// Throttle answers 429, with Fault.RetryAfter, without handling the call.
	Throttle
	// Stall holds the call for StallFor, or until the sender gives up, and
	// answers 503: a timeout for a call that was never processed.
	Stall
	// HandleLate hands the call to the receiver, whose handler waits
	// StallFor before it runs and commits: a timeout for a call that took
	// effect. The handler then runs on a context the sender's leaving does
	// not cancel, so that its writes (sink.Tx) commit.
	HandleLate
	// LoseAnswer hands the call to the receiver and, when it answers 200
	// delivered, sends a 503 instead, as if the answer were lost on its way
	// back: the dispatcher delivers again and the receiver answers
	// duplicate. Any other answer is sent as it is.
	LoseAnswer
)

var kindNames = [...]string{"pass", "fail", "throttle", "stall", "handle-late", "lose-answer"}

func (k Kind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return "Kind(" + strconv.Itoa(int(k)) + ")"
	}
	return kindNames[k]
}

// Fault is what happens to one call; the zero Fault passes it through.
type Fault struct {
	Kind Kind
	// Status is Fail's answer (default 503).
	Status int
	// RetryAfter is sent with Throttle's 429, rounded up to whole seconds;
	// zero sends no Retry-After.
	RetryAfter time.Duration
	// Reason is the error text of the answers the fault writes itself
	// (default: the Kind, "injected").
	Reason string
}

// Call is one request as the fault picker and the observer see it.
type Call struct {
	// Envelope is the body decoded before the receiver verified it: for
	// picking a fault and for counting, not for trusting. Its fields are
	// zero when the body is not an envelope.
	Envelope publish.Envelope
	// Received is when the request arrived.
	Received time.Time
	// Fault is what Pick chose.
	Fault Fault
}

// Outcome is a call once it has been answered.
type Outcome struct {
	Call
	// Status, Answer and Error are the receiver's answer (its status code,
	// and its body's "status" and "error"), or the fault's when the fault
	// answered instead.
	Status int
	Answer string
	Error  string
	// Duplicate is set when the receiver answered that the webhook-id was
	// handled before (sink.DuplicateHeader).
	Duplicate bool
	// AnswerLost is set when LoseAnswer replaced the receiver's 200 with a
	// 503: the call was handled, its sender thinks it failed.
	AnswerLost bool
}

// Config is what to inject and whom to tell.
type Config struct {
	// Pick chooses each call's fault; nil passes every call through. It is
	// called once per request, concurrently.
	Pick func(Call) Fault
	// StallFor is how long Stall and HandleLate hold a call: set it past
	// the sender's timeout (the route's "timeout").
	StallFor time.Duration
	// Observe, when set, is called once per request after its answer has
	// been written, concurrently; the server's Shutdown waits for it.
	Observe func(Outcome)
}

// Receiver is the fault-injecting receiver, an http.Handler.
type Receiver struct {
	cfg      Config
	receiver http.Handler
}

// New returns the receiver sink.NewReceiver(secret, d, h, opts...) behind
// the faults cfg picks. It panics where sink.NewReceiver does.
func New(secret []byte, d sink.Deduper, h sink.Handler, cfg Config, opts ...sink.Option) *Receiver {
	fr := &Receiver{cfg: cfg}
	fr.receiver = sink.NewReceiver(secret, d, fr.handleLate(h), opts...)
	return fr
}

type callKey struct{}

// CallFrom returns the call a Deduper's Begin or a Handler is running for,
// so that they can record it with its envelope and fault.
func CallFrom(ctx context.Context) (Call, bool) {
	c, ok := ctx.Value(callKey{}).(*Call)
	if !ok {
		return Call{}, false
	}
	return *c, true
}

// handleLate wraps the plugin's handler: a HandleLate call waits StallFor
// first. The wait ignores the sender: the point is to commit after it left.
func (fr *Receiver) handleLate(h sink.Handler) sink.Handler {
	return func(ctx context.Context, env publish.Envelope) error {
		if c, ok := CallFrom(ctx); ok && c.Fault.Kind == HandleLate {
			time.Sleep(fr.cfg.StallFor)
			ctx = context.WithoutCancel(ctx)
		}
		return h(ctx, env)
	}
}

// ServeHTTP reads the body, picks the call's fault, and answers with the
// fault, the receiver, or both; then reports the call to Observe.
func (fr *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := &Call{Received: time.Now()}
	// The decode reads at most what the receiver would accept by default;
	// the receiver gets the whole body and applies its own limit.
	head, err := io.ReadAll(io.LimitReader(r.Body, sink.DefaultMaxBodyBytes+1))
	if err != nil {
		fr.answer(w, Outcome{Call: *c, Status: http.StatusBadRequest, Answer: "rejected", Error: "could not read the body"})
		return
	}
	_ = json.Unmarshal(head, &c.Envelope) // the receiver refuses what does not decode
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(head), r.Body))
	if fr.cfg.Pick != nil {
		c.Fault = fr.cfg.Pick(*c)
	}

	f := c.Fault
	switch f.Kind {
	case Fail:
		status := f.Status
		if status == 0 {
			status = http.StatusServiceUnavailable
		}
		answer := "retry"
		if status < 500 && status != http.StatusTooManyRequests && status != http.StatusRequestTimeout {
			answer = "rejected"
		}
		fr.answer(w, Outcome{Call: *c, Status: status, Answer: answer, Error: f.reason()})
		return
	case Throttle:
		if f.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64((f.RetryAfter+time.Second-1)/time.Second), 10))
		}
		fr.answer(w, Outcome{Call: *c, Status: http.StatusTooManyRequests, Answer: "retry", Error: f.reason()})
		return
	case Stall:
		t := time.NewTimer(fr.cfg.StallFor)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
		fr.answer(w, Outcome{Call: *c, Status: http.StatusServiceUnavailable, Answer: "retry", Error: f.reason()})
		return
	}

	rec := &recorder{header: http.Header{}}
	fr.receiver.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	_ = json.Unmarshal(rec.body.Bytes(), &body)
	o := Outcome{Call: *c, Status: rec.status, Answer: body.Status, Error: body.Error,
		Duplicate: rec.header.Get(sink.DuplicateHeader) == "true"}
	if f.Kind == LoseAnswer && o.Status == http.StatusOK && !o.Duplicate {
		o.AnswerLost = true
		writeAnswer(w, http.StatusServiceUnavailable, "retry", "the answer was lost ("+f.reason()+"); the delivery was handled")
	} else {
		rec.writeTo(w)
	}
	fr.observe(o)
}

// answer writes a fault's own answer and reports it.
func (fr *Receiver) answer(w http.ResponseWriter, o Outcome) {
	writeAnswer(w, o.Status, o.Answer, o.Error)
	fr.observe(o)
}

// writeAnswer answers in the receiver's JSON shape.
func writeAnswer(w http.ResponseWriter, status int, answer, reason string) {
	body, _ := json.Marshal(struct {
		Status string `json:"status"`
		Error  string `json:"error,omitempty"`
	}{answer, reason}) // two strings: cannot fail
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (fr *Receiver) observe(o Outcome) {
	if fr.cfg.Observe != nil {
		fr.cfg.Observe(o)
	}
}

func (f Fault) reason() string {
	if f.Reason != "" {
		return f.Reason
	}
	return f.Kind.String() + ", injected"
}

// recorder keeps the receiver's answer so that it can be observed, or
// replaced.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

func (r *recorder) writeTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
