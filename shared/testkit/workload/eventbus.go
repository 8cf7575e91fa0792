package workload

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// EventBus is a local endpoint of the EventBridge API that answers every
// PutEvents at once, each entry accepted, and records when each message
// first arrived: a target that is never the bottleneck, for measuring how
// fast the deployment drains a backlog. The dispatch function's real
// EventBridge publisher (SDK client, SigV4, calls of up to 10 entries)
// reaches it through AWS_ENDPOINT_URL_EVENTBRIDGE.
//
// An entry carries the message's payload only, not its id: EventBus tells
// messages apart by the payload's "id" field, which CommitBulkBacklog
// writes. It reads that field by scanning the request for it rather than
// decoding the request: a full JSON decode of every entry would cost the
// target CPU on the cores the drain shares with the dispatchers and
// PostgreSQL.
type EventBus struct {
	// URL is the endpoint (AWS_ENDPOINT_URL_EVENTBRIDGE).
	URL string

	server *http.Server

	mu       sync.Mutex
	receipts map[uuid.UUID]time.Time

	calls, entries, duplicates, refused atomic.Int64
}

// StartEventBus serves an EventBus on a free loopback port.
func StartEventBus() (*EventBus, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &EventBus{URL: "http://" + l.Addr().String(), receipts: map[uuid.UUID]time.Time{}}
	b.server = &http.Server{Handler: http.HandlerFunc(b.serve), ReadHeaderTimeout: 10 * time.Second}
	go b.server.Serve(l)
	return b, nil
}

// The markers EventBus scans for. An entry's Detail is a JSON string, so
// inside it every quote is escaped: an unescaped "Detail": is a key of
// the request (one per entry), and the payload's id key appears escaped,
// as jsonb writes it (a space after the colon).
var (
	detailKey = []byte(`"Detail":`)
	idMarker  = []byte(`\"id\": \"`)
)

func (b *EventBus) serve(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	b.calls.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil || r.Header.Get("X-Amz-Target") != "AWSEvents.PutEvents" {
		b.refused.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"__type":"ValidationException","message":"not a PutEvents request"}`)
		return
	}
	n := countKeys(body, detailKey)
	var ids []uuid.UUID
	for rest := body; ; {
		i := bytes.Index(rest, idMarker)
		if i < 0 || len(rest) < i+len(idMarker)+36 {
			break
		}
		rest = rest[i+len(idMarker):]
		if id, err := uuid.ParseBytes(rest[:36]); err == nil {
			ids = append(ids, id)
		}
		rest = rest[36:]
	}
	b.entries.Add(int64(n))
	b.mu.Lock()
	for _, id := range ids {
		if _, seen := b.receipts[id]; seen {
			b.duplicates.Add(1)
			continue
		}
		b.receipts[id] = arrived
	}
	b.mu.Unlock()

	var out strings.Builder
	out.WriteString(`{"FailedEntryCount":0,"Entries":[`)
	for i := range n {
		if i > 0 {
			out.WriteByte(',')
		}
		fmt.Fprintf(&out, `{"EventId":"e%d"}`, i)
	}
	out.WriteString(`]}`)
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	io.WriteString(w, out.String())
}

// countKeys counts the unescaped occurrences of key (one starting with a
// quote that no backslash precedes).
func countKeys(body, key []byte) int {
	n := 0
	for i := 0; ; {
		j := bytes.Index(body[i:], key)
		if j < 0 {
			return n
		}
		if at := i + j; at == 0 || body[at-1] != '\\' {
			n++
		}
		i += j + len(key)
	}
}

// Received is the number of distinct messages received so far.
func (b *EventBus) Received() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.receipts)
}

// Receipts is a copy of each message's first arrival, by message id.
func (b *EventBus) Receipts() map[uuid.UUID]time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.receipts)
}

// Counts are the calls the endpoint answered: Calls the PutEvents
// requests, Duplicates the entries of a message already received, Refused
// the requests that were not PutEvents.
func (b *EventBus) Counts() TargetCounts {
	return TargetCounts{Calls: b.calls.Load(), Duplicates: b.duplicates.Load(), Refused: b.refused.Load()}
}

// Entries is the number of entries received, duplicates included.
func (b *EventBus) Entries() int64 { return b.entries.Load() }

// Close stops the server.
func (b *EventBus) Close() error { return b.server.Close() }
