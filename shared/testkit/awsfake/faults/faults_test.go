package faults_test

import (
	"context"
	"sync"
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
	// A call with less than the timer's resolution left (the precise
	// sleep alone) is still not answered before its due time.
	arrived = time.Now().Add(-latency + time.Millisecond)
	if !faults.Wait(ctx, &c, arrived) {
		t.Fatal("a call with a millisecond left was not answered")
	}
	if took := time.Since(arrived); took < latency {
		t.Errorf("a call with latency %s, a millisecond left on arrival, was answered after %s", latency, took)
	}
	// A client that gave up is not answered, whatever the time left.
	gone, stop := context.WithCancel(ctx)
	stop()
	if faults.Wait(gone, &c, time.Now().Add(-latency+time.Millisecond)) {
		t.Error("a call whose client gave up during the precise sleep was answered")
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

// MaxInFlight is the most calls served at once, not the calls served: a
// call counts from Enter until its leave, and calls that overlap count
// together, whichever goroutines serve them.
func TestInFlightCountsTheMostCallsAtOnce(t *testing.T) {
	t.Parallel()
	var f faults.InFlight
	if got := f.MaxInFlight(); got != 0 {
		t.Fatalf("a fake that served nothing says %d in flight at most", got)
	}
	for range 5 { // one after another: never two at once
		faults.Enter(&f)()
	}
	if got := f.MaxInFlight(); got != 1 {
		t.Errorf("five calls one after another: MaxInFlight %d, want 1", got)
	}

	const overlapping = 8
	var entered, release sync.WaitGroup
	entered.Add(overlapping)
	release.Add(1)
	var done sync.WaitGroup
	for range overlapping {
		done.Go(func() {
			leave := faults.Enter(&f)
			entered.Done()
			release.Wait()
			leave()
		})
	}
	entered.Wait()
	release.Done()
	done.Wait()
	if got := f.MaxInFlight(); got != overlapping {
		t.Errorf("%d calls held at once: MaxInFlight %d", overlapping, got)
	}
	faults.Enter(&f)() // all left: the next call alone does not raise it
	if got := f.MaxInFlight(); got != overlapping {
		t.Errorf("after all left, one more call: MaxInFlight %d, want still %d", got, overlapping)
	}
}
