//go:build !linux

package faults

import "time"

// sleepUntil sleeps until t on a runtime timer: elsewhere than Linux the
// fakes' latency is as precise as the runtime's timers.
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }
