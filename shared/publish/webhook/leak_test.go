package webhook

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// TestNoGoroutineLeaks runs every path — delivered, error answers,
// timeouts, hang-ups, a canceled caller — then checks that once the
// connections are closed no goroutine outlives them. It does not run in
// parallel: it counts the process's goroutines.
func TestNoGoroutineLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		var n atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			switch n.Add(1) % 5 {
			case 0:
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprint(w, strings.Repeat("busy ", 400))
			case 1:
				<-r.Context().Done() // outlives the request timeout
			case 2:
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					conn.Close()
				}
			default:
			}
		}))
		defer srv.Close()
		p := newTestPublisher(t, srv.URL, func(c *Config) { c.Timeout = 50 * time.Millisecond; c.Concurrency = 1 })
		for range 3 {
			results := p.Publish(t.Context(), publishtest.Messages(10, 128))
			for i, r := range results {
				if r.Kind == 0 {
					t.Fatalf("message %d: no result", i)
				}
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		for _, r := range p.Publish(ctx, publishtest.Messages(5, 64)) {
			if r.Code != outboxtype.CodeCanceled {
				t.Fatalf("canceled caller: %s %s", r.Kind, r.Code)
			}
		}
		// With the server still up, nothing on the client side may remain
		// once the idle connections are closed: a body left unclosed keeps
		// its connection's goroutines alive.
		p.client.CloseIdleConnections()
		waitFor(t, "client-side goroutines", func() (bool, string) {
			stacks := allStacks()
			for _, g := range strings.Split(stacks, "\n\n") {
				if strings.Contains(g, "net/http.(*persistConn)") || strings.Contains(g, "webhook.(*Publisher)") {
					return false, g
				}
			}
			return true, ""
		})
	}()

	waitFor(t, "goroutines", func() (bool, string) {
		n := runtime.NumGoroutine()
		return n <= before, fmt.Sprintf("%d goroutines before, %d after:\n%s", before, n, allStacks())
	})
}

// waitFor polls done for up to five seconds, then fails with its report.
func waitFor(t *testing.T, what string, done func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, report := done()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s leaked:\n%s", what, report)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func allStacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}
