package report

import "time"

// before are figures of the last published run before the three
// optimisations it measured as proposals were applied to the product (the
// docs/BENCHMARKS.md generated 2026-11-21 12:19 UTC, committed in
// d67cf42): the "before" of the section on applied optimisations.
var before = struct {
	When, Commit, Load string
	// Batch is the batch of the figures below.
	Batch int
	// Floor1 is that run's bare-SQL floor on one connection (msgs/s): the
	// measure of how fast the machine was then.
	Floor1 float64
	Grid   []struct {
		Batch, Dispatchers int
		Then               string
	}
	// Claim1 and Complete1 are the engine's p50s at batch Batch with one
	// dispatcher.
	Claim1, Complete1 time.Duration
	// Latency is the engine against the fixed-latency target, and
	// LatencyPrototype the pipelined prototype (msgs/s).
	Latency, LatencyPrototype float64
	// The turn-by-turn comparison, one dispatcher: claim p50 as it was and
	// with the raw scan, complete p50 as it was and with the lean function,
	// and the batch cycle p50 as it was and with both, for one and two
	// dispatchers.
	ABClaim, ABClaimRaw, ABComplete, ABCompleteLean time.Duration
	ABCycle1, ABCycleBoth1, ABCycle2, ABCycleBoth2  time.Duration
	// ABGain1 and ABGain2 are the estimated rate gains of both, as
	// published.
	ABGain1, ABGain2 string
}{
	When: "generated 2026-11-21 12:19 UTC", Commit: "0959f25", Load: "1.45–1.48",
	Batch: 1000, Floor1: 35011,
	Grid: []struct {
		Batch, Dispatchers int
		Then               string
	}{
		{1000, 1, "25,046 msgs/s (72% of the floor)"},
		{1000, 2, "36,370 msgs/s (75% of the floor)"},
		{1000, 4, "47,344 msgs/s (2.36× River)"},
	},
	Claim1: 21400 * time.Microsecond, Complete1: 16800 * time.Microsecond,
	Latency: 3172, LatencyPrototype: 3700,
	ABClaim: 18800 * time.Microsecond, ABClaimRaw: 14600 * time.Microsecond,
	ABComplete: 14400 * time.Microsecond, ABCompleteLean: 13900 * time.Microsecond,
	ABCycle1: 34000 * time.Microsecond, ABCycleBoth1: 29700 * time.Microsecond,
	ABCycle2: 50600 * time.Microsecond, ABCycleBoth2: 42500 * time.Microsecond,
	ABGain1: "+15%", ABGain2: "+19%",
}
