// Package latency summarises samples of durations by percentile.
package latency

import (
	"slices"
	"time"
)

// Summary is a sample's size and percentiles.
type Summary struct {
	N             int
	P50, P99, Max time.Duration
}

// Summarise picks the nearest-rank percentiles of samples (a zero Summary
// for none).
func Summarise(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Summary{N: len(s), P50: rank(0.50), P99: rank(0.99), Max: s[len(s)-1]}
}
