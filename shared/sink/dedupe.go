package sink

import (
	"context"
	"errors"
	"sync"
)

// ErrDuplicate is Begin's answer for a webhook-id already handled.
var ErrDuplicate = errors.New("sink: duplicate delivery")

// Deduper remembers which webhook-ids were handled, so that a redelivery
// does not run the handler again. See the package doc for the protocol and
// the trade-offs of each implementation.
type Deduper interface {
	// Begin holds webhookID for one delivery. It returns ErrDuplicate when
	// the id was handled (committed) before. Otherwise the returned context
	// is the one the handler runs with (it may carry a transaction, see Tx)
	// and the Delivery must be finished with Commit or Rollback. A Begin
	// for an id another delivery holds waits until that one is finished,
	// then answers for the outcome: a duplicate after a Commit, the hold
	// after a Rollback; or it returns ctx's error.
	Begin(ctx context.Context, webhookID string) (context.Context, Delivery, error)
}

// Delivery is one held webhook-id.
type Delivery interface {
	// Commit records the id as handled, with whatever the handler wrote in
	// the delivery's transaction, if it has one.
	Commit(ctx context.Context) error
	// Rollback releases the id unrecorded (and undoes the handler's writes
	// in the delivery's transaction), so a redelivery runs the handler.
	Rollback(ctx context.Context) error
}

// MemoryDeduper is a Deduper in process memory: for tests and local
// development. It never forgets an id (memory grows with the ids handled)
// and forgets them all on restart.
type MemoryDeduper struct {
	mu       sync.Mutex
	handled  map[string]struct{}
	inFlight map[string]chan struct{} // closed when the holder finishes
}

var _ Deduper = (*MemoryDeduper)(nil)

// NewMemoryDeduper returns an empty MemoryDeduper.
func NewMemoryDeduper() *MemoryDeduper {
	return &MemoryDeduper{handled: map[string]struct{}{}, inFlight: map[string]chan struct{}{}}
}

// Begin implements Deduper.
func (d *MemoryDeduper) Begin(ctx context.Context, webhookID string) (context.Context, Delivery, error) {
	for {
		d.mu.Lock()
		if _, ok := d.handled[webhookID]; ok {
			d.mu.Unlock()
			return ctx, nil, ErrDuplicate
		}
		done, held := d.inFlight[webhookID]
		if !held {
			done = make(chan struct{})
			d.inFlight[webhookID] = done
			d.mu.Unlock()
			return ctx, &memoryDelivery{d: d, id: webhookID, done: done}, nil
		}
		d.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx, nil, ctx.Err()
		}
	}
}

// Handled reports whether webhookID was committed.
func (d *MemoryDeduper) Handled(webhookID string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.handled[webhookID]
	return ok
}

type memoryDelivery struct {
	d    *MemoryDeduper
	id   string
	done chan struct{}
	once sync.Once
}

func (m *memoryDelivery) Commit(context.Context) error {
	m.finish(true)
	return nil
}

func (m *memoryDelivery) Rollback(context.Context) error {
	m.finish(false)
	return nil
}

func (m *memoryDelivery) finish(handled bool) {
	m.once.Do(func() {
		m.d.mu.Lock()
		if handled {
			m.d.handled[m.id] = struct{}{}
		}
		delete(m.d.inFlight, m.id)
		m.d.mu.Unlock()
		close(m.done)
	})
}
