package outboxrun

import (
	"os"
	"runtime/debug"
	"strconv"

	"github.com/outboxkit/dispatcher/shared/config"
)

// PaceCollector runs this process's garbage collector at the pace the
// dispatcher's functions set at their cold start (config.FunctionGCPercent),
// so that the engine measured in process runs as it is deployed; every
// system a benchmark measures in this process runs under it alike. GOGC,
// when set, is left as the runtime applied it. It returns the pace in
// effect (GOGC's percent; -1: off).
func PaceCollector() int {
	if v := os.Getenv("GOGC"); v != "" {
		if v == "off" {
			return -1
		}
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
		return 100 // the runtime ignores a GOGC it cannot read
	}
	debug.SetGCPercent(config.FunctionGCPercent)
	return config.FunctionGCPercent
}

// AtCollectorPace runs f with the collector at percent, then restores the
// pace it found.
func AtCollectorPace(percent int, f func()) {
	defer debug.SetGCPercent(debug.SetGCPercent(percent))
	f()
}
