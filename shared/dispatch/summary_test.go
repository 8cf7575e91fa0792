package dispatch_test

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"

	"github.com/outboxkit/dispatcher/shared/dispatch"
)

// The dispatch function's answer is a contract: callers,
// the soak and the end-to-end tests decode it into dispatch.Summary, so
// its field names are pinned here rather than by a copy of the type.
func TestSummaryAnswersWithTheDesignsFieldNames(t *testing.T) {
	t.Parallel()
	raw, err := json.Marshal(dispatch.Summary{Targets: map[string]*dispatch.TargetStats{"http": {Delivered: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatal(err)
	}
	want := []string{"worker_id", "batches", "claimed", "delivered", "retried", "dead", "lease_lost",
		"released", "held", "duration_ms", "stopped_by"}
	if got := slices.Sorted(maps.Keys(fields)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("the answer's fields are %v, want %v", got, want)
	}
}
