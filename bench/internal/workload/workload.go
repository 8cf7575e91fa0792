// Package workload is what every system in the comparison is given: the same
// number of messages with the same payload bytes.
package workload

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Spec is the message count and payload size of a run.
type Spec struct {
	Messages     int
	PayloadBytes int
}

// Payload returns a JSON object of exactly size bytes (at least 64), shaped
// like a usage snapshot: a few short fields and padding.
func Payload(size int) json.RawMessage {
	head := `{"tenant_id":"tenant-42","turn_id":"turn-1","model":"m-large","tokens_in":1200,"tokens_out":340,"pad":"`
	tail := `"}`
	pad := max(size-len(head)-len(tail), 0)
	p := head + strings.Repeat("x", pad) + tail
	if !json.Valid([]byte(p)) {
		panic(fmt.Sprintf("workload: payload of %d bytes is not JSON", size))
	}
	return json.RawMessage(p)
}
