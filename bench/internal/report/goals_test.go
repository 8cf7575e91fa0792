package report

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/bench/internal/outboxrun"
	"github.com/outboxkit/dispatcher/bench/internal/riverrun"
	"github.com/outboxkit/dispatcher/bench/internal/suite"
)

func burnDown(messages int, took time.Duration, dispatchers, conns int) outboxrun.BurnDownResult {
	return outboxrun.BurnDownResult{Messages: messages, Elapsed: took,
		Options: outboxrun.BurnDownOptions{BatchSize: 1000, Dispatchers: dispatchers, Conns: conns}}
}

// The River goal compares River's pool with the faster of the engine's two
// runs on as many connections, and names both.
func TestTheRiverGoalTakesTheFasterRunOnRiversConnections(t *testing.T) {
	r := &suite.Results{
		Config:     suite.Config{ComparisonBatch: 1000},
		Grid:       []outboxrun.BurnDownResult{burnDown(200000, 4*time.Second, suite.RiverDispatchers, 0), burnDown(200000, 3*time.Second, 2, 0)},
		RiverPools: burnDown(200000, 3200*time.Millisecond, suite.RiverDispatchers/suite.FunctionPool, suite.FunctionPool),
		River:      riverrun.Result{Jobs: 200000, Work: 10 * time.Second},
	}
	g := Goals(r)[0]
	if !g.Known || g.Target != 2.5 {
		t.Fatalf("the River goal: %+v", g)
	}
	// 62,500 msgs/s on pools of 2 against 20,000 jobs/s.
	if g.Ratio < 3.124 || g.Ratio > 3.126 {
		t.Errorf("ratio %.3f, want 3.125 (the run on pools)", g.Ratio)
	}
	for _, want := range []string{"2 dispatchers on pools of 2", "4 dispatchers: 2.50×", "the grid's best, batch 1000 × 2, is 3.33×"} {
		if !strings.Contains(g.Measured, want) {
			t.Errorf("%q lacks %q", g.Measured, want)
		}
	}
	// Without the run on pools, the one-connection run is the comparison.
	r.RiverPools = outboxrun.BurnDownResult{}
	if g := Goals(r)[0]; !g.Known || g.Ratio < 2.49 || g.Ratio > 2.51 {
		t.Errorf("without the run on pools: %+v", g)
	}
}
