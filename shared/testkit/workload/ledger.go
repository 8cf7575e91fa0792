package workload

import (
	"maps"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Ledger is what the producers committed: each message's commit time.
type Ledger struct {
	mu        sync.Mutex
	committed map[uuid.UUID]time.Time
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{committed: map[uuid.UUID]time.Time{}} }

// Committed notes that ids committed at at.
func (l *Ledger) Committed(at time.Time, ids ...uuid.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		l.committed[id] = at
	}
}

// Len is the number of messages committed so far.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.committed)
}

// CommitTimes is a copy of the commit times, by message id.
func (l *Ledger) CommitTimes() map[uuid.UUID]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.committed)
}
