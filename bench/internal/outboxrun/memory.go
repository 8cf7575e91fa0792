package outboxrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/scratch"
	"github.com/outboxkit/dispatcher/bench/internal/workload"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
)

// MemoryResult is the dispatch function's memory on one invocation.
type MemoryResult struct {
	Messages int
	// ColdHWM is the peak resident set after the cold start, before any
	// invocation; PeakHWM after one invocation of Messages messages
	// (VmHWM of /proc/<pid>/status), and RSS the resident set then.
	ColdHWM, PeakHWM, RSS int64
	Delivered             int
	PutEventsCalls        int64
	Duration              time.Duration
}

// eventBridgeSink answers every PutEvents call with success for every entry:
// just enough of the AWS JSON 1.1 protocol for the SDK client.
type eventBridgeSink struct{ calls atomic.Int64 }

func (s *eventBridgeSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ Entries []json.RawMessage }
	if r.Header.Get("X-Amz-Target") != "AWSEvents.PutEvents" || json.NewDecoder(r.Body).Decode(&req) != nil {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"__type":"ValidationException","message":"not a PutEvents request"}`))
		return
	}
	n := s.calls.Add(1)
	var b strings.Builder
	b.WriteString(`{"FailedEntryCount":0,"Entries":[`)
	for i := range req.Entries {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"EventId":"evt-%d-%d"}`, n, i)
	}
	b.WriteString(`]}`)
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Write([]byte(b.String()))
}

// Memory builds the real dispatch bootstrap (shared/testkit/lambdatest.BuildBinary,
// the deployment's flags), enqueues messages, launches the binary under
// the Lambda Runtime API harness with an EventBridge route whose endpoint is
// a local sink answering success, invokes it once for the whole batch and
// reads the process's peak resident set.
func Memory(ctx context.Context, srv *scratch.Server, spec workload.Spec, messages int) (MemoryResult, error) {
	res := MemoryResult{Messages: messages}
	binary, err := buildDispatch()
	if err != nil {
		return res, err
	}
	db, err := srv.CreateMigrated(ctx, "memory")
	if err != nil {
		return res, err
	}
	defer db.Drop()
	pool, err := db.Pool(ctx, 1)
	if err != nil {
		return res, err
	}
	payload := workload.Payload(spec.PayloadBytes)
	for from := 0; from < messages; from += EnqueueBatchSize {
		batch := make([]outbox.Message, 0, EnqueueBatchSize)
		for i := from; i < min(messages, from+EnqueueBatchSize); i++ {
			batch = append(batch, outbox.Message{Namespace: Namespace, Topic: Topic, TenantID: fmt.Sprintf("tenant-%d", i%16),
				DedupeKey: fmt.Sprintf("tenant-%d/turn-%d/req-1", i%16, i), Payload: payload})
		}
		if _, err := outbox.EnqueueBatch(ctx, pool, batch); err != nil {
			pool.Close()
			return res, err
		}
	}
	pool.Close()

	sink := &eventBridgeSink{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	httpSrv := &http.Server{Handler: sink}
	go httpSrv.Serve(l)
	defer httpSrv.Close()

	fn, err := lambdatest.Launch(binary, "dispatch",
		"OUTBOX_DATABASE_URL="+db.URL,
		"OUTBOX_TRACING=off",
		"OUTBOX_FUNCTION_TIMEOUT=60s",
		"OUTBOX_BATCH_SIZE="+strconv.Itoa(messages),
		`OUTBOX_ROUTES={"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"eventbridge","event_bus":"bench"}}]}`,
		"AWS_ENDPOINT_URL_EVENTBRIDGE=http://"+l.Addr().String(),
	)
	if err != nil {
		return res, err
	}
	defer fn.Stop()
	if _, err := fn.ColdStart(30 * time.Second); err != nil {
		return res, fmt.Errorf("dispatch cold start: %w\n%s", err, fn.Stderr())
	}
	pid, err := findProcess(binary)
	if err != nil {
		return res, err
	}
	if res.ColdHWM, _, err = memoryOf(pid); err != nil {
		return res, err
	}
	var summary struct {
		Claimed   int `json:"claimed"`
		Delivered int `json:"delivered"`
	}
	start := time.Now()
	if err := fn.InvokeJSON(ctx, map[string]int{"batch_size": messages, "max_batches": 1}, 60*time.Second, &summary); err != nil {
		return res, fmt.Errorf("dispatch invocation: %w\n%s", err, fn.Stdout())
	}
	res.Duration = time.Since(start)
	if res.PeakHWM, res.RSS, err = memoryOf(pid); err != nil {
		return res, err
	}
	res.Delivered = summary.Delivered
	res.PutEventsCalls = sink.calls.Load()
	if summary.Delivered != messages {
		return res, fmt.Errorf("the dispatch invocation delivered %d of %d messages:\n%s", summary.Delivered, messages, fn.Stdout())
	}
	return res, nil
}

// buildDispatch runs lambdatest.BuildBinary from the product module's root,
// which it finds from the working directory.
func buildDispatch() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root, err := productRoot(wd)
	if err != nil {
		return "", err
	}
	if err := os.Chdir(root); err != nil {
		return "", err
	}
	defer os.Chdir(wd)
	return lambdatest.BuildBinary("dispatch")
}

// productRoot is the nearest directory above dir holding the product's
// go.mod.
func productRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/outboxkit/dispatcher\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("no github.com/outboxkit/dispatcher go.mod above the working directory")
		}
	}
}

// findProcess finds the running process of binary: its path is unique (a
// fresh temporary directory per build).
func findProcess(binary string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == binary {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no running process of %s", binary)
}

// memoryOf reads VmHWM and VmRSS, in bytes.
func memoryOf(pid int) (hwm, rss int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			hwm = kb * 1024
		case "VmRSS:":
			rss = kb * 1024
		}
	}
	if hwm == 0 {
		return 0, 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
	}
	return hwm, rss, nil
}

// BuildDispatch builds the dispatch bootstrap from the product's module
// (bench runs from its own).
func BuildDispatch() (string, error) { return buildDispatch() }
