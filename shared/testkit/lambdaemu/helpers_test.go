package lambdaemu_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
)

// probeAnswer is the probe function's response (internal/probe).
type probeAnswer struct {
	PID         int     `json:"pid"`
	Invocations int64   `json:"invocations"`
	RequestID   string  `json:"request_id"`
	SpunCPUMS   float64 `json:"spun_cpu_ms"`
	SpunWallMS  float64 `json:"spun_wall_ms"`
	Invoked     *struct {
		StatusCode    int32           `json:"status_code"`
		FunctionError string          `json:"function_error"`
		Payload       json.RawMessage `json:"payload"`
		Error         string          `json:"error"`
	} `json:"invoked"`
}

func probeBinary(t *testing.T) string {
	t.Helper()
	path, err := lambdatest.BuildPackage("./shared/testkit/lambdaemu/internal/probe")
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func newEmulator(t *testing.T, opts lambdaemu.Options) *lambdaemu.Emulator {
	t.Helper()
	e, err := lambdaemu.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// register adds the probe as name with cfg's other settings.
func register(t *testing.T, e *lambdaemu.Emulator, name string, cfg lambdaemu.FunctionConfig) {
	t.Helper()
	cfg.Name, cfg.Binary = name, probeBinary(t)
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second // a loaded machine's cold start is not a timeout
	}
	if err := e.Register(cfg); err != nil {
		t.Fatal(err)
	}
}

func invoke(t *testing.T, e *lambdaemu.Emulator, name, payload string) (lambdaemu.Invocation, probeAnswer) {
	t.Helper()
	inv, err := e.Invoke(name, []byte(payload))
	if err != nil {
		t.Fatalf("invoke %s: %v", name, err)
	}
	var a probeAnswer
	if inv.Outcome == lambdaemu.OutcomeSucceeded {
		if err := json.Unmarshal(inv.Response, &a); err != nil {
			t.Fatalf("%s answered %s: %v", name, inv.Response, err)
		}
	}
	return inv, a
}

func sdkClient(e *lambdaemu.Emulator) *lambda.Client {
	return lambda.NewFromConfig(e.AWSConfig())
}

func stats(t *testing.T, e *lambdaemu.Emulator, name string) lambdaemu.Stats {
	t.Helper()
	s, err := e.Stats(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func invocations(t *testing.T, e *lambdaemu.Emulator, name string) []lambdaemu.Invocation {
	t.Helper()
	invs, err := e.Invocations(name)
	if err != nil {
		t.Fatal(err)
	}
	return invs
}

func waitIdle(t *testing.T, e *lambdaemu.Emulator, name string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	if err := e.WaitIdle(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// maxOverlap is the most invocations whose [Start, End] intervals
// overlap: the concurrency the records show, independently of the
// emulator's own counter.
func maxOverlap(invs []lambdaemu.Invocation) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, inv := range invs {
		edges = append(edges, edge{inv.Start, +1}, edge{inv.End, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}
