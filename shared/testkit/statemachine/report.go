package statemachine

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// The invariants, as the report numbers them.
const (
	InvStaleWriter    = 1 // no outcome recorded by a worker whose lease was not live when it wrote
	InvOneLeasePerKey = 2 // never two live leases covering one key
	InvPausedClaimed  = 3 // no claim returns a paused message
	InvKeyOrder       = 4 // per key, DISPATCHED in sequence order
	InvNothingLost    = 5 // enqueued = pending + dead + terminal in the archive; revoked producers refused
	InvCallFailed     = 6 // a call the contract says succeeds failed (a deadlock among them)
)

var invariantNames = map[int]string{
	InvStaleWriter:    "stale writer",
	InvOneLeasePerKey: "one live lease per key",
	InvPausedClaimed:  "paused message claimed",
	InvKeyOrder:       "order per key",
	InvNothingLost:    "nothing lost, nobody unconfined",
	InvCallFailed:     "call failed",
}

// Violation is one broken invariant, as found after one step.
type Violation struct {
	Invariant int
	Step      int
	Seed      int64
	Message   string
}

func (v Violation) String() string {
	return fmt.Sprintf("invariant %d (%s), seed %d, step %d: %s", v.Invariant, invariantNames[v.Invariant], v.Seed, v.Step, v.Message)
}

// Report is what a run did and found.
type Report struct {
	Seed    int64
	Server  string // the server's version and autovacuum setting
	Steps   int
	Elapsed time.Duration
	// Actions counts the steps by kind.
	Actions map[string]int
	// Committed is the messages producers committed; Claims and
	// Completions the calls made.
	Committed, Claims, Completions int
	Violations                     []Violation
	// Schedule is the last steps before the run ended (all of them when
	// Config.Trace is set), one line each.
	Schedule []string
}

// Failed reports whether an invariant was broken.
func (r *Report) Failed() bool { return len(r.Violations) > 0 }

// Invariants is the set of invariants broken.
func (r *Report) Invariants() map[int]bool {
	m := map[int]bool{}
	for _, v := range r.Violations {
		m[v.Invariant] = true
	}
	return m
}

// WriteText writes the report for a person.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "seed %d on %s: %d steps in %s, %d messages committed, %d claims, %d completions\n",
		r.Seed, r.Server, r.Steps, r.Elapsed.Round(time.Millisecond), r.Committed, r.Claims, r.Completions)
	kinds := make([]string, 0, len(r.Actions))
	for k := range r.Actions {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	parts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.Actions[k]))
	}
	fmt.Fprintf(w, "  steps: %s\n", strings.Join(parts, ", "))
	if !r.Failed() {
		fmt.Fprintf(w, "  every invariant held\n")
		return
	}
	fmt.Fprintf(w, "  %d violation(s):\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(w, "  - %s\n", v)
	}
	fmt.Fprintf(w, "  the schedule's last steps:\n")
	for _, s := range r.Schedule {
		fmt.Fprintf(w, "    %s\n", s)
	}
}
