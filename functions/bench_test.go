package functions_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// BenchmarkColdStart measures each function's bootstrap from process start
// to its first poll of /next — configuration, AWS config, a connection to a
// local PostgreSQL and its ping included — and reports the binary's size.
//
//	go test -run '^$' -bench ColdStart -benchtime 20x ./functions/
func BenchmarkColdStart(b *testing.B) {
	db := pgtest.New(b)
	routes := `{"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"eventbridge","event_bus":"default"}}]}`
	for _, name := range []string{"dispatch", "reaper", "dlq-replay", "metrics"} {
		b.Run(name, func(b *testing.B) {
			bin := lambdatest.Build(b, name)
			info, err := os.Stat(bin)
			if err != nil {
				b.Fatal(err)
			}
			var total time.Duration
			for range b.N {
				f, err := lambdatest.Launch(bin, name, "OUTBOX_DATABASE_URL="+db.URL, "OUTBOX_TRACING=off", "OUTBOX_ROUTES="+routes)
				if err != nil {
					b.Fatal(err)
				}
				d, err := f.ColdStart(30 * time.Second)
				f.Stop()
				if err != nil {
					b.Fatal(err)
				}
				total += d
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/coldstart")
			b.ReportMetric(float64(info.Size())/(1<<20), "MB")
		})
	}
}

// BenchmarkDispatchDrain measures one dispatch invocation draining a backlog
// to a no-op target (a wire-level EventBridge that answers at once), through
// the real binary: the rate the function itself sustains (the last run's),
// the bootstraps' CPU per message (their whole lives: cold start and the
// drain) and their peak resident memory. The bootstrap runs with the collector its cold start
// sets (config.GCPercent); a GOGC in the benchmark's environment is passed
// on to it instead, to compare paces:
//
//	go test -run '^$' -bench DispatchDrain -benchtime 3x ./functions/
//	GOGC=100 go test -run '^$' -bench DispatchDrain -benchtime 3x ./functions/
//	GODEBUG=gctrace=1 go test -run '^$' -bench DispatchDrain ./functions/  # and the collections each bootstrap made
func BenchmarkDispatchDrain(b *testing.B) {
	const backlog = 20_000
	eb := eventbridgefake.New(b)
	payload := json.RawMessage(fmt.Sprintf(`{"tenant_id":"tenant-42","tokens":1200,"pad":%q}`, strings.Repeat("x", 460)))
	var rate, peakMiB float64
	var cpu time.Duration
	var pace []string
	if gogc := os.Getenv("GOGC"); gogc != "" {
		pace = append(pace, "GOGC="+gogc)
	}
	// GODEBUG=gctrace=1 is passed on too: the bootstraps' collections are
	// then counted from their standard error.
	gctrace := strings.Contains(os.Getenv("GODEBUG"), "gctrace=1")
	if gctrace {
		pace = append(pace, "GODEBUG="+os.Getenv("GODEBUG"))
	}
	collections := 0
	for range b.N {
		b.StopTimer()
		db := pgtest.New(b)
		for from := 0; from < backlog; from += 1000 {
			batch := make([]outbox.Message, 1000)
			for i := range batch {
				batch[i] = outbox.Message{Namespace: "billing", Topic: "usage", DedupeKey: fmt.Sprintf("k-%d", from+i), Payload: payload}
			}
			if _, err := outbox.EnqueueBatch(context.Background(), db.Pool, batch); err != nil {
				b.Fatal(err)
			}
		}
		db.Pool.Exec(context.Background(), "VACUUM ANALYZE outbox.pending")
		envs := append([]string{"OUTBOX_DATABASE_URL=" + db.URL, "OUTBOX_TRACING=off", "OUTBOX_FUNCTION_TIMEOUT=5m",
			"OUTBOX_BATCH_SIZE=1000", "OUTBOX_MAX_BATCHES=100", "AWS_ENDPOINT_URL_EVENTBRIDGE=" + eb.URL(),
			`OUTBOX_ROUTES={"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"eventbridge","event_bus":"default"}}]}`},
			pace...)
		f := lambdatest.Start(b, lambdatest.Build(b, "dispatch"), "dispatch", envs...)
		if _, err := f.ColdStart(30 * time.Second); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		var sum dispatch.Summary
		if err := f.InvokeJSON(context.Background(), []byte(`{}`), 4*time.Minute, &sum); err != nil {
			b.Fatal(err)
		}
		if sum.Delivered != backlog {
			b.Fatalf("delivered %d of %d: %+v", sum.Delivered, backlog, sum)
		}
		rate = float64(sum.Delivered) / (float64(sum.DurationMS) / 1000)
		cpu += processCPU(b, f.PID())
		peakMiB = max(peakMiB, float64(peakRSS(b, f.PID()))/(1<<20))
		for _, line := range strings.Split(f.Stderr(), "\n") {
			if strings.HasPrefix(line, "gc ") {
				collections++
			}
		}
	}
	if gctrace {
		b.ReportMetric(float64(collections)/float64(b.N), "collections")
	}
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*backlog), "cpu-µs/msg")
	b.ReportMetric(peakMiB, "peak-MiB")
}

// processCPU is the CPU time a process has used so far, user and system
// (/proc/<pid>/stat, in the kernel's clock ticks of 10 ms).
func processCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Skipf("no /proc: %v", err)
	}
	// The command name, in parentheses, may hold spaces: the fields
	// counted are those after it (utime and stime are the 14th and 15th).
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("/proc/%d/stat: %q", pid, stat)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
