package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/faults"
)

// A call is answered at once without faults, not before the latency has
// passed since its arrival with one, and never while stalled: a stalled
// call ends when its client gives up or the fake is released, unanswered.
func TestLatencyStallResumeRelease(t *testing.T) {
	t.Parallel()
	var c faults.Controls
	ctx := context.Background()
	if !faults.Wait(ctx, &c, time.Now()) {
		t.Fatal("a call without faults was not answered")
	}

	const latency = 30 * time.Millisecond
	c.SetLatency(latency)
	arrived := time.Now()
	if !faults.Wait(ctx, &c, arrived) {
		t.Fatal("a delayed call was not answered")
	}
	if took := time.Since(arrived); took < latency {
		t.Errorf("a call with latency %s was answered after %s", latency, took)
	}
	// The latency counts from the arrival: a call that spent it already
	// (reading its request, say) is answered at once.
	if !faults.Wait(ctx, &c, time.Now().Add(-latency)) {
		t.Fatal("a call past its latency was not answered")
	}
	c.SetLatency(0)

	c.Stall()
	gaveUp, cancel := context.WithCancel(ctx)
	cancel()
	if faults.Wait(gaveUp, &c, time.Now()) {
		t.Error("a stalled call was answered after its client gave up")
	}
	held := make(chan bool)
	go func() { held <- faults.Wait(ctx, &c, time.Now()) }()
	faults.Release(&c)
	if <-held {
		t.Error("a stalled call was answered when the fake was released")
	}

	var resumed faults.Controls
	resumed.Stall()
	resumed.Resume()
	if !faults.Wait(ctx, &resumed, time.Now()) {
		t.Error("a call after Resume was not answered")
	}
}
