package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxkit/dispatcher/shared/publish"
)

// Handler is the plugin author's code: it handles one delivered envelope.
// A nil error acknowledges it; Reject refuses it for good; RetryLater asks
// for it again later; any other error is a failure the dispatcher retries.
type Handler func(ctx context.Context, env publish.Envelope) error

// DuplicateHeader is set ("true") on the 200 that answers a delivery whose
// webhook-id was already handled.
const DuplicateHeader = "Outbox-Duplicate"

// Defaults of the options.
const (
	// DefaultTolerance is how far a webhook-timestamp may be from the
	// receiver's clock, either way; the Standard Webhooks libraries use the
	// same.
	DefaultTolerance = 5 * time.Minute
	// DefaultMaxBodyBytes is the largest body read: the dispatcher's own
	// default cap, plus room.
	DefaultMaxBodyBytes = 2 << 20
	// finishTimeout bounds Commit and Rollback, which run even when the
	// sender has gone away: a handled delivery is recorded regardless.
	finishTimeout = 10 * time.Second
)

// Option adjusts a receiver.
type Option func(*receiver)

// WithTolerance sets how far a webhook-timestamp may be from now, either way
// (default DefaultTolerance).
func WithTolerance(d time.Duration) Option { return func(r *receiver) { r.tolerance = d } }

// WithMaxBodyBytes sets the largest body accepted (default
// DefaultMaxBodyBytes); a larger one is answered 413.
func WithMaxBodyBytes(n int64) Option { return func(r *receiver) { r.maxBody = n } }

// WithClock replaces time.Now for the timestamp check.
func WithClock(now func() time.Time) Option { return func(r *receiver) { r.now = now } }

// WithOffloadClient sets the client that fetches payloads a route offloaded
// to S3 from the envelope's presigned URL (default: a client with a 30s
// timeout).
func WithOffloadClient(c *http.Client) Option { return func(r *receiver) { r.offload = c } }

// WithLogger sets where failures (handler errors, panics, deduper errors)
// are logged (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(r *receiver) { r.log = l } }

type receiver struct {
	verifier  *standardwebhooks.Webhook
	dedupe    Deduper
	handle    Handler
	tolerance time.Duration
	maxBody   int64
	now       func() time.Time
	log       *slog.Logger
	offload   *http.Client
}

// NewReceiver returns the http.Handler that receives the dispatcher's
// deliveries signed with secret (the raw key; see webhook.ParseSecret),
// deduplicates them with d and hands each new one to h. It panics when
// secret is empty or d or h is nil: a receiver without them would accept
// forgeries or lose deliveries.
func NewReceiver(secret []byte, d Deduper, h Handler, opts ...Option) http.Handler {
	if len(secret) == 0 {
		panic("sink: NewReceiver: empty signing secret")
	}
	if d == nil || h == nil {
		panic("sink: NewReceiver: nil Deduper or Handler (use NewMemoryDeduper in tests)")
	}
	verifier, err := standardwebhooks.NewWebhookRaw(secret)
	if err != nil {
		panic("sink: NewReceiver: " + err.Error())
	}
	r := &receiver{
		verifier: verifier, dedupe: d, handle: h,
		tolerance: DefaultTolerance, maxBody: DefaultMaxBodyBytes, now: time.Now, log: slog.Default(),
		offload: &http.Client{Timeout: 30 * time.Second},
	}
	for _, opt := range opts {
		opt(r)
	}
	return r
}

// answer is every response body.
type answer struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reply(w, http.StatusMethodNotAllowed, answer{Status: "rejected", Error: "only POST is accepted"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, rc.maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			reply(w, http.StatusRequestEntityTooLarge, answer{Status: "rejected", Error: fmt.Sprintf("body over %d bytes", rc.maxBody)})
			return
		}
		reply(w, http.StatusBadRequest, answer{Status: "rejected", Error: "could not read the body"})
		return
	}
	if status, err := rc.verify(body, req.Header); err != nil {
		reply(w, status, answer{Status: "rejected", Error: err.Error()})
		return
	}
	id := req.Header.Get(standardwebhooks.HeaderWebhookID)
	env, err := decodeEnvelope(body, id)
	if err != nil {
		reply(w, http.StatusBadRequest, answer{Status: "rejected", Error: err.Error()})
		return
	}

	ctx, delivery, err := rc.dedupe.Begin(req.Context(), id)
	switch {
	case errors.Is(err, ErrDuplicate):
		w.Header().Set(DuplicateHeader, "true")
		reply(w, http.StatusOK, answer{Status: "duplicate"})
		return
	case err != nil:
		if req.Context().Err() == nil { // not merely the sender giving up while a duplicate was in flight
			rc.log.ErrorContext(req.Context(), "sink: deduper unavailable", "webhook_id", id, "error", err)
		}
		reply(w, http.StatusServiceUnavailable, answer{Status: "retry", Error: "the receiver cannot check for duplicates right now"})
		return
	}

	// An offloaded payload is fetched once the delivery is known new; a
	// failed fetch is retried by the dispatcher, with a fresh URL.
	var fetchErr error
	if env.Offload != nil {
		fetchErr = rc.fetchPayload(ctx, &env)
	}
	var handlerErr error
	if fetchErr == nil {
		handlerErr = rc.run(ctx, env)
	}
	finishCtx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), finishTimeout)
	defer cancel()
	if fetchErr != nil {
		if rbErr := delivery.Rollback(finishCtx); rbErr != nil {
			rc.log.ErrorContext(req.Context(), "sink: rollback after a failed payload fetch failed", "webhook_id", id, "error", rbErr)
		}
		rc.log.ErrorContext(req.Context(), "sink: could not fetch the offloaded payload", "webhook_id", id, "error", fetchErr)
		reply(w, http.StatusServiceUnavailable, answer{Status: "retry", Error: "the offloaded payload could not be fetched"})
		return
	}
	if handlerErr != nil {
		if rbErr := delivery.Rollback(finishCtx); rbErr != nil {
			rc.log.ErrorContext(req.Context(), "sink: rollback after a handler error failed", "webhook_id", id, "error", rbErr)
		}
		rc.replyHandlerError(w, req, id, handlerErr)
		return
	}
	if err := delivery.Commit(finishCtx); err != nil {
		rc.log.ErrorContext(req.Context(), "sink: could not record a handled delivery", "webhook_id", id, "error", err)
		reply(w, http.StatusInternalServerError, answer{Status: "retry", Error: "the delivery could not be recorded"})
		return
	}
	reply(w, http.StatusOK, answer{Status: "delivered"})
}

// verify checks the signature with the Standard Webhooks library, then the
// timestamp against this receiver's tolerance and clock. The status is the
// answer to a failure.
func (rc *receiver) verify(body []byte, header http.Header) (int, error) {
	if err := rc.verifier.VerifyIgnoringTimestamp(body, header); err != nil {
		switch {
		case errors.Is(err, standardwebhooks.ErrRequiredHeaders):
			return http.StatusBadRequest, errors.New("missing webhook-id, webhook-timestamp or webhook-signature")
		case errors.Is(err, standardwebhooks.ErrInvalidHeaders):
			return http.StatusBadRequest, errors.New("malformed webhook-timestamp")
		}
		return http.StatusUnauthorized, errors.New("bad signature")
	}
	// The library parsed it already; it is an integer.
	ts, _ := strconv.ParseInt(header.Get(standardwebhooks.HeaderWebhookTimestamp), 10, 64)
	now := rc.now()
	switch age := now.Unix() - ts; {
	case age > int64(rc.tolerance/time.Second):
		return http.StatusUnauthorized, fmt.Errorf("webhook-timestamp is %ds old, over the %s tolerance", age, rc.tolerance)
	case -age > int64(rc.tolerance/time.Second):
		return http.StatusUnauthorized, fmt.Errorf("webhook-timestamp is %ds in the future, over the %s tolerance", -age, rc.tolerance)
	}
	return 0, nil
}

// decodeEnvelope reads a delivery's body; its key must be the signed
// webhook-id, which is what deduplication trusts.
func decodeEnvelope(body []byte, webhookID string) (publish.Envelope, error) {
	var env publish.Envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return env, fmt.Errorf("the body is not an envelope: %w", err)
	}
	switch {
	case env.ID == "" || env.Key == "" || env.Namespace == "" || env.Topic == "":
		return env, errors.New("the envelope lacks id, key, namespace or topic")
	case len(env.Payload) == 0:
		return env, errors.New("the envelope has no payload")
	case env.Key != webhookID:
		return env, errors.New("the envelope's key is not the webhook-id")
	}
	return env, nil
}

// fetchPayload replaces an offloaded envelope's null payload with the
// object its presigned URL serves, which must be the size the envelope
// says. The URL comes from the signed body, so only the dispatcher chose it.
func (rc *receiver) fetchPayload(ctx context.Context, env *publish.Envelope) error {
	o := env.Offload
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.URL, nil)
	if err != nil {
		return fmt.Errorf("the offload URL: %w", err)
	}
	resp, err := rc.offload.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET s3://%s/%s: %s", o.S3Bucket, o.S3Key, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(o.Size)+1))
	if err != nil {
		return err
	}
	if len(body) != o.Size {
		return fmt.Errorf("s3://%s/%s holds %d bytes or more, the envelope says %d", o.S3Bucket, o.S3Key, len(body), o.Size)
	}
	env.Payload = body
	return nil
}

// run calls the handler, turning a panic into an error so the delivery is
// rolled back and retried rather than left held.
func (rc *receiver) run(ctx context.Context, env publish.Envelope) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return rc.handle(ctx, env)
}

func (rc *receiver) replyHandlerError(w http.ResponseWriter, req *http.Request, id string, err error) {
	var he *HandlerError
	if errors.As(err, &he) {
		if he.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(he.RetryAfter.Seconds())), 10))
		}
		status := "rejected"
		if he.Status == http.StatusTooManyRequests {
			status = "retry"
		}
		reply(w, he.Status, answer{Status: status, Error: he.Error()})
		return
	}
	rc.log.ErrorContext(req.Context(), "sink: handler failed", "webhook_id", id, "error", err)
	reply(w, http.StatusInternalServerError, answer{Status: "retry", Error: "the handler failed"})
}

func reply(w http.ResponseWriter, status int, a answer) {
	body, _ := json.Marshal(a) // two strings: cannot fail
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
