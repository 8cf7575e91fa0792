package faults

import (
	"syscall"
	"time"
)

// sleepUntil sleeps until t with nanosleep(2), which the kernel's
// high-resolution timers wake within tens of microseconds. It holds its
// OS thread for at most preciseFinish; the runtime hands the goroutine's
// processor to others meanwhile, as for any blocking system call.
func sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(int64(d))
		if err := syscall.Nanosleep(&ts, nil); err != nil && err != syscall.EINTR {
			time.Sleep(time.Until(t))
			return
		}
	}
}
