package dispatch

import "time"

// SetLonerRunTime sets how long a lone key's run may take to publish and
// still grow (lonerRunTime), for a test of the runs' growth that must not
// depend on how fast a loaded machine publishes under the race detector.
func (e *Engine) SetLonerRunTime(d time.Duration) { e.lonerRunTime = d }
