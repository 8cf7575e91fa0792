package lambdashare

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/floor"
	"github.com/outboxkit/dispatcher/shared/testkit/deploybench"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
)

// The report's contract: autovacuum=on|off on a line of its own, and a
// last line ending "ratio R" with R = EventBridge rate × workers ÷ floor.
func TestPrintEndsWithTheRatio(t *testing.T) {
	share := lambdaemu.CPUShareStatus{Requested: lambdaemu.CPULambdaShare, Enabled: true, Dir: "/sys/fs/cgroup/cpu/lambdaemu-1-x"}
	r := Result{
		Options:  Options{Backlog: 100000, FloorRounds: 3, DrainRounds: 3},
		Settings: Settings{Version: "15", Autovacuum: "on", SharedBuffers: "128MB", Fsync: "on", SynchronousCommit: "on"},
		Template: deploybench.TemplateFacts{DispatchMemoryMB: 256, DispatchMaxWorkers: 8},
		Floor:    floor.Result{Clients: 2, BatchSize: 1000, Messages: 40000, Elapsed: time.Second},
		EventBridge: deploybench.DrainResult{Target: "eventbridge", MemoryMB: 256, CPUShare: share,
			Delivered: 100000, Took: 20 * time.Second, CPU: 2900 * time.Millisecond},
		Webhook: deploybench.DrainResult{Target: "webhook", MemoryMB: 256, CPUShare: share,
			Delivered: 100000, Took: 40 * time.Second, CPU: 5800 * time.Millisecond},
	}
	var b strings.Builder
	r.Print(&b)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if !regexp.MustCompile(`(?m)^autovacuum=on$`).MatchString(b.String()) {
		t.Errorf("no autovacuum=on line:\n%s", b.String())
	}
	// 5,000 msgs/s × 8 ÷ 40,000 = 1.00
	if last := lines[len(lines)-1]; !strings.HasSuffix(last, "ratio 1.00") {
		t.Errorf("last line %q, want it to end with ratio 1.00", last)
	}
	md := r.Markdown()
	for _, want := range []string{"## Lambda's CPU share", "| **1.00** |", "| **0.50** |", "14471 µs"} {
		if !strings.Contains(md, want) {
			t.Errorf("the section lacks %q:\n%s", want, md)
		}
	}
}
