package outboxrun

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/publishers"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
)

// LocalTarget is a real target type served on this machine with a fixed
// latency per call: a route table naming it, and the publishers the
// dispatch function builds for that table (shared/publish/publishers.Build, the
// function's own wiring: its HTTP clients, its AWS SDK clients and their
// retryers), pointed at the local server.
type LocalTarget struct {
	// Routes is the route table, one catch-all route to the target.
	Routes string
	// Latency is what each call takes, from the request's arrival to its
	// answer.
	Latency time.Duration
	// PerCall is the most messages one call carries.
	PerCall int
	// Calls is the number of calls the server has answered so far.
	Calls func() int64
	// Served, when set, is the server's own time over those calls, from
	// each request's arrival to its answer: the latency as the server's
	// timer delivered it.
	Served func() time.Duration

	deps  publishers.Deps
	close func()
}

// Publishers builds the publishers of table's targets, as a cold start of
// the dispatch function does.
func (t *LocalTarget) Publishers(ctx context.Context, table *route.Table) (map[string]publish.Publisher, error) {
	return publishers.Build(ctx, table, t.deps)
}

// Close stops the server.
func (t *LocalTarget) Close() { t.close() }

// webhookSecretEnv names the signing secret's variable in the route table;
// Deps.Getenv answers it.
const webhookSecretEnv = "BENCH_WEBHOOK_SECRET"

// NewWebhookTarget serves an http target on 127.0.0.1 that answers every
// POST with 204 after latency: the real webhook publisher (Standard
// Webhooks signing, one message per call) delivers to it.
func NewWebhookTarget(latency time.Duration) (*LocalTarget, error) {
	var calls, served atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(latency - time.Since(arrived))
		calls.Add(1)
		served.Add(int64(time.Since(arrived)))
		w.WriteHeader(http.StatusNoContent)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: handler}
	go srv.Serve(l)
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		srv.Close()
		return nil, err
	}
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	return &LocalTarget{
		Routes: fmt.Sprintf(`{"routes":[{"match":{"namespace":"*","topic":"*"},
  "target":{"type":"http","url":"http://%s/hook","signing_secret_env":%q}}]}`, l.Addr(), webhookSecretEnv),
		Latency: latency, PerCall: 1,
		Calls:  calls.Load,
		Served: func() time.Duration { return time.Duration(served.Load()) },
		deps: publishers.Deps{SigningSecret: func(name string) string {
			if name == webhookSecretEnv {
				return secret
			}
			return ""
		}},
		close: func() { srv.Close() },
	}, nil
}

// SNSFIFOTopic is the FIFO topic of NewSNSFIFOTarget.
var SNSFIFOTopic = snsfake.TopicARN("bench-ordered.fifo")

// NewSNSFIFOTarget serves the project's wire-level SNS fake
// (shared/testkit/awsfake/snsfake), every PublishBatch taking latency, and routes
// everything to a FIFO topic on it: the real SNS publisher, through the
// client sns.NewClient builds (the publisher's PublishBatch serializer, the
// SDK's signer, retryer and deserializer), sends each key's run in ordered
// PublishBatch calls of up to 10.
func NewSNSFIFOTarget(latency time.Duration) (*LocalTarget, error) {
	tb := &cleanupTB{}
	fake := snsfake.New(tb)
	fake.SetLatency(latency)
	return &LocalTarget{
		Routes: fmt.Sprintf(`{"routes":[{"match":{"namespace":"*","topic":"*"},
  "target":{"type":"sns","topic_arn":%q}}]}`, SNSFIFOTopic),
		Latency: latency, PerCall: 10,
		Calls:  func() int64 { return int64(fake.Requests()) },
		Served: fake.ServedTime,
		deps:   publishers.Deps{AWS: fake.Config()},
		close:  tb.cleanup,
	}, nil
}

// cleanupTB is the testing.TB snsfake.New asks for, outside a test: it keeps
// the cleanups the fake registers (stopping its server), which cleanup
// runs. snsfake.New calls nothing else; any other method would panic on the
// nil embedded interface.
type cleanupTB struct {
	testing.TB
	cleanups []func()
}

func (t *cleanupTB) Helper()          {}
func (t *cleanupTB) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }

func (t *cleanupTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
