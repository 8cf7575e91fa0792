// Package migratefn is the migrate function's handler: it applies the
// outbox migrations from inside the database's VPC, where a laptop cannot
// reach, when CloudFormation deploys the stack (a custom resource) or when
// invoked by hand.
//
// Two kinds of event:
//
//   - a CloudFormation custom resource request (RequestType, ResponseURL):
//     Create and Update apply every pending migration, Delete does nothing
//     — deleting the stack never drops the outbox and its messages. The
//     answer goes to the pre-signed ResponseURL, SUCCESS or FAILED with
//     the reason, always: a request left unanswered holds the stack for an
//     hour. So a bad configuration or an unreachable database fails the
//     request, not the cold start, and the work stops early enough to
//     answer before the function's deadline.
//   - a manual one, {"action":"up"} (the default, {}) or
//     {"action":"status"}, answered with what was applied and what is
//     pending.
//
// The database is the functions' (a URL, a Secrets Manager secret or RDS
// IAM authentication, through shared/dbpool); its user must own schema
// outbox. It connects at the first invocation, not at the cold start.
package migratefn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/cfn"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/handler"
)

const function = "migrate"

// PhysicalResourceID names the custom resource's one physical resource,
// the schema: stable, so that an Update never reads as a replacement
// (which would send a Delete for the old one).
const PhysicalResourceID = "outbox-schema"

// responseReserve is the time kept before the invocation's deadline to
// answer CloudFormation: the migrations are cut off then, so that a
// FAILED is sent rather than nothing.
const responseReserve = 10 * time.Second

// responseTimeout bounds the PUT of the answer to ResponseURL.
const responseTimeout = 5 * time.Second

// Event is a manual invocation.
type Event struct {
	// Action is "up" (the default) or "status".
	Action string `json:"action,omitempty"`
}

// Answer is what a manual invocation returns, and the Data of a custom
// resource's answer (Version, Latest, Applied).
type Answer struct {
	Action string `json:"action"`
	// Applied lists the migrations this invocation applied.
	Applied []string `json:"applied"`
	// Version is the newest applied migration after the invocation; Latest
	// the newest this function holds.
	Version int64 `json:"version"`
	Latest  int64 `json:"latest"`
	Pending int   `json:"pending"`
}

// Handler is the migrate function's handler.
type Handler struct {
	RT *handler.Runtime
	// configErr is a configuration the function could not read: every
	// request fails with it (Delete, which touches nothing, excepted).
	configErr error
	cfg       config.Function
	deps      handler.Deps
	// HTTPClient sends the answers to ResponseURL (nil: one with
	// responseTimeout).
	HTTPClient *http.Client

	mu       sync.Mutex
	migrator *migrations.Migrator
}

// New builds the handler from the function's configuration, or from the
// error reading it: a custom resource request still gets its answer.
func New(cfg config.Function, cfgErr error, deps handler.Deps) (*Handler, func()) {
	h := &Handler{RT: handler.NewRuntime(function, cfg, deps), configErr: cfgErr, cfg: cfg, deps: deps}
	return h, h.Close
}

// Close closes the pool, if one was opened.
func (h *Handler) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.migrator != nil {
		h.migrator.Close()
		h.migrator = nil
	}
}

// Handle answers one event: a custom resource request or a manual one.
func (h *Handler) Handle(ctx context.Context, raw json.RawMessage) (any, error) {
	log, _ := h.RT.Begin(ctx)
	var probe struct {
		RequestType string `json:"RequestType"`
		ResponseURL string `json:"ResponseURL"`
	}
	_ = json.Unmarshal(raw, &probe)
	if probe.RequestType != "" && probe.ResponseURL != "" {
		var ev cfn.Event
		if err := json.Unmarshal(raw, &ev); err != nil {
			return nil, &handler.EventError{Function: function, Problem: "malformed CloudFormation request: " + err.Error()}
		}
		status, err := h.customResource(ctx, ev)
		if err != nil {
			log.Error("custom resource request not answered", "request_type", string(ev.RequestType), "error", err.Error())
			return nil, err
		}
		log.Info("custom resource request answered", "request_type", string(ev.RequestType), "status", status)
		return map[string]string{"status": status}, nil
	}

	var ev Event
	if err := handler.DecodeEvent(function, raw, &ev); err != nil {
		return nil, err
	}
	switch ev.Action {
	case "", "up":
		ev.Action = "up"
	case "status":
	default:
		return nil, &handler.EventError{Function: function, Problem: fmt.Sprintf("action must be up or status, got %q", ev.Action)}
	}
	answer, err := h.run(ctx, ev.Action)
	if err != nil {
		log.Error("migrate failed", "action", ev.Action, "error", err.Error())
		return nil, &handler.InvocationError{Function: function, Err: err}
	}
	log.Info("migrate", "action", ev.Action, "applied", len(answer.Applied), "version", answer.Version, "pending", answer.Pending)
	return answer, nil
}

// customResource does what the request asks and sends CloudFormation the
// answer; it returns the status sent, or why nothing could be sent.
func (h *Handler) customResource(ctx context.Context, ev cfn.Event) (string, error) {
	resp := cfn.NewResponse(&ev)
	resp.PhysicalResourceID = PhysicalResourceID
	if ev.RequestType == cfn.RequestDelete && ev.PhysicalResourceID != "" {
		// Answer with the id CloudFormation holds, whatever it is.
		resp.PhysicalResourceID = ev.PhysicalResourceID
	}
	var err error
	switch ev.RequestType {
	case cfn.RequestCreate, cfn.RequestUpdate:
		workCtx, cancel := contextBeforeDeadline(ctx, responseReserve)
		var answer Answer
		answer, err = h.run(workCtx, "up")
		cancel()
		if err == nil {
			resp.Data = map[string]any{"Version": answer.Version, "Latest": answer.Latest, "Applied": len(answer.Applied)}
		}
	case cfn.RequestDelete:
		// Deleting the stack (or replacing the resource) leaves the
		// schema and its messages: dropping them is `outboxctl migrate
		// down`, by hand.
	default:
		err = fmt.Errorf("unknown RequestType %q", ev.RequestType)
	}
	resp.Status = cfn.StatusSuccess
	if err != nil {
		resp.Status = cfn.StatusFailed
		resp.Reason = reason(err)
	}
	return string(resp.Status), h.send(ctx, ev.ResponseURL, resp)
}

// run applies the pending migrations (up) or lists them (status).
func (h *Handler) run(ctx context.Context, action string) (Answer, error) {
	m, err := h.open(ctx)
	if err != nil {
		return Answer{}, err
	}
	answer := Answer{Action: action, Applied: []string{}, Latest: m.Latest()}
	if action == "up" {
		results, err := m.Up(ctx)
		for _, r := range results {
			answer.Applied = append(answer.Applied, r.Source)
		}
		if err != nil {
			return answer, err
		}
	}
	states, err := m.Status(ctx)
	if err != nil {
		return answer, err
	}
	for _, s := range states {
		if s.Applied {
			answer.Version = max(answer.Version, s.Version)
		} else {
			answer.Pending++
		}
	}
	return answer, nil
}

// migrationsNeed says what the migrations need a session for.
const migrationsNeed = "the migrations (they hold a session-level advisory lock while they run)"

// open connects on first use and keeps the pool for the next invocations.
func (h *Handler) open(ctx context.Context) (*migrations.Migrator, error) {
	if h.configErr != nil {
		return nil, h.configErr
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.migrator != nil {
		return h.migrator, nil
	}
	cfg := h.cfg
	if err := cfg.Database.NeedSession(migrationsNeed); err != nil {
		return nil, err
	}
	// The advisory lock holds one session while another migrates.
	cfg.Database.MaxConns = max(cfg.Database.MaxConns, 2)
	c, err := handler.Connect(ctx, function, cfg, h.deps, h.RT, 0)
	if err != nil {
		return nil, err
	}
	m, err := migrations.OpenPool(c.Pool.Pool)
	if err != nil {
		return nil, err
	}
	h.migrator = m
	return m, nil
}

// send PUTs the answer to the pre-signed ResponseURL (an S3 URL: a function
// in private subnets reaches it through a NAT gateway or an S3 gateway
// endpoint).
func (h *Handler) send(ctx context.Context, responseURL string, resp *cfn.Response) error {
	body, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), responseTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, responseURL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("answer CloudFormation: %w", err)
	}
	// The pre-signed URL was signed without a Content-Type.
	req.Header.Del("Content-Type")
	req.ContentLength = int64(len(body))
	client := h.HTTPClient
	if client == nil {
		client = &http.Client{Timeout: responseTimeout}
	}
	res, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("answer CloudFormation at its ResponseURL: %w (a function in private subnets needs a NAT gateway or an S3 gateway endpoint)", redactURL(err))
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("answer CloudFormation: the ResponseURL answered %s", res.Status)
	}
	return nil
}

// reason is err as CloudFormation shows it in the stack's events: one line,
// within the response's size limit.
func reason(err error) string {
	r := strings.Join(strings.Fields(err.Error()), " ")
	const limit = 1000
	if len(r) > limit {
		r = r[:limit] + "…"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		r += " (the migrations ran out of the function's time: raise MigrateFunction's timeout, or run outboxctl migrate up from inside the VPC)"
	}
	return r
}

// redactURL drops the pre-signed URL (its signature) from an HTTP error.
func redactURL(err error) error {
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return urlErr.Err
	}
	return err
}

// contextBeforeDeadline is ctx ending reserve before its deadline (if it
// has one).
func contextBeforeDeadline(ctx context.Context, reserve time.Duration) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, d.Add(-reserve))
	}
	return context.WithCancel(ctx)
}
