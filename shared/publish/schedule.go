package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// Batcher is the scheduler every publisher delivers through. A publisher
// supplies how one message becomes an entry (Prepare) and how one call
// carries entries (Call); the Batcher decides which entries go in which call
// and when, so that a Publish keeps the order the Publisher contract
// promises.
//
// # Scheduling
//
// The messages are cut into lanes: those of one Namespace and OrderingKey,
// in SequenceID order (a stable sort, so ties keep their order in msgs), and
// each message without an ordering key a lane of its own. A lane is ready
// when none of its entries is in an unanswered call and it has entries left.
// Calls are packed greedily, one at a time as a slot frees up: the ready
// lanes, in order of first appearance in msgs, each give their next
// consecutive entries until the call has MaxEntries or the next entry would
// take it over MaxBytes. When a call returns, each of its lanes moves past
// its delivered entries and is ready again, or stops at its first failure
// and releases the rest.
//
// So 500 unordered messages go out 10 per call, as many calls at once as
// Concurrency allows; 3 keys of 3 messages go out as one call of 9; one key
// of 100 as 10 calls of 10, one after another; and with MaxEntries 1 each
// key's messages go one after another while different keys and unordered
// messages go side by side.
//
// Entries are prepared as they are packed, so the first call goes out
// before the last message is encoded; the goroutine that called Publish
// packs and settles, and at most Concurrency calls are in flight at once.
type Batcher[E any] struct {
	// MaxEntries is the most entries one call carries: 1 for a target that
	// takes one message per call.
	MaxEntries int
	// MaxBytes caps the sum of the entry sizes of one call, 0 for no cap.
	// An entry over it by itself still goes, alone: refusing what the
	// target cannot take is Prepare's job.
	MaxBytes int
	// Concurrency is the most calls in flight at once.
	Concurrency int
	// Prepare builds m's entry and its size in bytes, or answers m without
	// a call (refused: a terminal result, typically, such as a payload over
	// the target's cap). It runs on the goroutine that called Publish, once
	// per message at most, in lane order; a message it is not called for
	// was cut off by the context or released. A panic in it answers that
	// message alone, retryable.
	Prepare func(m *outboxtype.Message) (entry E, size int, refused *Result)
	// Call makes one call carrying entries (msgs[j] is entries[j]'s
	// message) and answers entries[j] in results[j]; results arrive zeroed,
	// and an entry left unanswered comes back retryable. The entries are
	// the call's own: Call may change them (a batch entry's id, say). The
	// Batcher sets each result's Latency to the call's duration unless
	// Call did.
	//
	// isolate reports a call refused as a whole for something in one of
	// its entries that the target does not name (SNS's InvalidParameter,
	// EventBridge's ValidationException): the Batcher then re-sends the
	// entries in parts, as Isolation says, so that only the entry at fault
	// keeps the refusal. A panic in Call answers that call's entries alone,
	// retryable.
	Call func(ctx context.Context, msgs []*outboxtype.Message, entries []E, results []Result) (isolate bool)
	// Isolation is how a call refused as a whole is re-sent.
	Isolation Isolation
}

// Isolation is how a Batcher re-sends the entries of a call refused as a
// whole for one of them. The parts go one after another, in the goroutine that
// made the call (so Concurrency still holds), and a lane that failed in one
// part has its entries in the later parts Released instead of sent.
type Isolation uint8

const (
	// IsolateInHalves re-sends each half, recursively, while a part of more
	// than one entry is refused as a whole: few calls when one entry of ten
	// is bad (7), at most 2n-1 when all are.
	IsolateInHalves Isolation = iota
	// IsolateOneByOne re-sends every entry alone: always n calls.
	IsolateOneByOne
)

func (i Isolation) parts(idx []int) [][]int {
	if i == IsolateOneByOne {
		parts := make([][]int, len(idx))
		for k := range idx {
			parts[k] = idx[k : k+1]
		}
		return parts
	}
	mid := len(idx) / 2
	return [][]int{idx[:mid], idx[mid:]}
}

var (
	// released is the result of a message held back behind its lane's
	// first failure.
	released = Result{Kind: Released, Err: ErrEarlierNotDelivered}
	// errUnanswered is the error of an entry a Call left without a result.
	errUnanswered = errors.New("publish: the call gave this entry no result; it may or may not have been accepted")
)

// Publish delivers msgs as the Publisher contract says and returns exactly
// len(msgs) results, result i for msgs[i].
func (b Batcher[E]) Publish(ctx context.Context, msgs []*outboxtype.Message) []Result {
	s := newSchedule(&b, msgs)
	// A lane has at most one call in flight, so more calls at once than
	// lanes could never be.
	inFlight := min(max(b.Concurrency, 1), len(s.lanes))
	if inFlight <= 1 {
		for {
			c, ok := s.nextCall(ctx)
			if !ok {
				break
			}
			b.send(ctx, c)
			s.settle(c)
		}
	} else {
		s.fanOut(ctx, inFlight)
	}
	s.cutOff(ctx)
	return s.results
}

// schedule is one Publish's state. Only the goroutine that called Publish
// touches it; a call's goroutine sees nothing but its call.
type schedule[E any] struct {
	b       *Batcher[E]
	msgs    []*outboxtype.Message
	results []Result
	// order holds the indices of msgs lane by lane, each lane in SequenceID
	// order; a lane is a window on it.
	order []int
	lanes []lane[E]
	// ready is the queue of lanes ready to send, by index, in the order
	// they became ready.
	ready []int
	// arena backs every call's windows: each message rides in at most one
	// packed call, so len(msgs) entries are enough, allocated once.
	arena  call[E]
	filled int
}

// lane is one ordering key's messages, or one unordered message.
type lane[E any] struct {
	// order[next:end] are the lane's messages not yet put in a call; next
	// == end once the lane is done, delivered or stopped.
	next, end int
	// held is order[next] prepared but not yet sent: an entry that did not
	// fit the call being packed, or a refusal that must wait until the
	// lane's entries in flight are answered (if one of them fails, the
	// refused message is Released instead).
	held *prepared[E]
}

type prepared[E any] struct {
	entry   E
	size    int
	refused *Result
}

// call is one call's entries, as windows on the schedule's arena (or, for
// an isolating re-send, on slices of its own).
type call[E any] struct {
	msgs    []*outboxtype.Message
	entries []E
	results []Result
	// positions[j] is entries[j]'s index in the Publish's msgs, lanes[j]
	// its lane's.
	positions []int
	lanes     []int
}

type laneKey struct{ namespace, orderingKey string }

func newSchedule[E any](b *Batcher[E], msgs []*outboxtype.Message) *schedule[E] {
	n := len(msgs)
	s := &schedule[E]{
		b: b, msgs: msgs, results: make([]Result, n), order: make([]int, n),
		arena: call[E]{
			msgs: make([]*outboxtype.Message, n), entries: make([]E, n), results: make([]Result, n),
			positions: make([]int, n), lanes: make([]int, n),
		},
	}
	laneOf := make([]int, n)
	sizes := make([]int, 0, n)
	var keyed map[laneKey]int
	for i, m := range msgs {
		if m == nil || m.OrderingKey == "" {
			laneOf[i] = len(sizes)
			sizes = append(sizes, 1)
			continue
		}
		if keyed == nil {
			keyed = map[laneKey]int{}
		}
		k := laneKey{m.Namespace, m.OrderingKey}
		li, ok := keyed[k]
		if !ok {
			li = len(sizes)
			keyed[k] = li
			sizes = append(sizes, 0)
		}
		laneOf[i] = li
		sizes[li]++
	}
	// Lanes are windows on one array, in order of first appearance: sized
	// above, filled below in input order, so that the stable sort keeps
	// equal sequence ids as given.
	s.lanes = make([]lane[E], len(sizes))
	s.ready = make([]int, len(sizes))
	start := 0
	for li, size := range sizes {
		s.lanes[li] = lane[E]{next: start, end: start}
		s.ready[li] = li
		start += size
	}
	for i, li := range laneOf {
		l := &s.lanes[li]
		s.order[l.end] = i
		l.end++
	}
	bySequence := func(i, j int) int { return cmp.Compare(msgs[i].SequenceID, msgs[j].SequenceID) }
	for li := range s.lanes {
		if l := &s.lanes[li]; l.end-l.next > 1 {
			slices.SortStableFunc(s.order[l.next:l.end], bySequence)
		}
	}
	return s
}

// nextCall packs the next call from the ready lanes; false when none is
// ready or ctx has ended.
func (s *schedule[E]) nextCall(ctx context.Context) (call[E], bool) {
	if ctx.Err() != nil {
		return call[E]{}, false
	}
	maxEntries := max(s.b.MaxEntries, 1)
	start, bytes := s.filled, 0
	full := false
	for len(s.ready) > 0 && !full {
		li := s.ready[0]
		l := &s.lanes[li]
		took := 0
		for l.next < l.end {
			if s.filled-start == maxEntries {
				full = true
				break
			}
			p := s.prepareNext(l)
			if p.refused != nil {
				if took == 0 {
					s.results[s.order[l.next]] = *p.refused
					s.stop(l, l.next+1)
				} else {
					l.held = hold(p)
				}
				break
			}
			if s.b.MaxBytes > 0 && s.filled > start && bytes+p.size > s.b.MaxBytes {
				l.held, full = hold(p), true
				break
			}
			s.pack(li, p.entry)
			bytes += p.size
			took++
		}
		if took == 0 && l.next < l.end {
			break // its next entry opens the next call
		}
		s.ready = s.ready[1:] // in flight, or answered without a call
	}
	if s.filled == start {
		return call[E]{}, false
	}
	return s.window(start, s.filled), true
}

// prepareNext is the lane's next message prepared: the held one, or a new
// one.
func (s *schedule[E]) prepareNext(l *lane[E]) (p prepared[E]) {
	if l.held != nil {
		p, l.held = *l.held, nil
		return p
	}
	defer func() {
		if v := recover(); v != nil {
			r := Retry(outboxtype.CodeTarget5xx, fmt.Errorf("panic while publishing: preparing the message: %v", v), 0)
			p = prepared[E]{refused: &r}
		}
	}()
	p.entry, p.size, p.refused = s.b.Prepare(s.msgs[s.order[l.next]])
	return p
}

// hold copies p to the heap; only held entries pay for it.
func hold[E any](p prepared[E]) *prepared[E] { return &p }

func (s *schedule[E]) pack(li int, entry E) {
	l := &s.lanes[li]
	j, i := s.filled, s.order[l.next]
	s.arena.msgs[j], s.arena.entries[j], s.arena.positions[j], s.arena.lanes[j] = s.msgs[i], entry, i, li
	l.next++
	s.filled++
}

func (s *schedule[E]) window(start, end int) call[E] {
	a := s.arena
	// Full slice expressions: a Call that appends cannot reach a
	// neighbour's entries.
	return call[E]{
		msgs: a.msgs[start:end:end], entries: a.entries[start:end:end], results: a.results[start:end:end],
		positions: a.positions[start:end:end], lanes: a.lanes[start:end:end],
	}
}

// stop ends a lane: its messages from order[from] on are Released.
func (s *schedule[E]) stop(l *lane[E], from int) {
	for _, i := range s.order[from:l.end] {
		s.results[i] = released
	}
	l.next, l.held = l.end, nil
}

// settle takes a returned call's answers: each lane in it moves past its
// delivered entries and is ready again, or stops at its first failure.
func (s *schedule[E]) settle(c call[E]) {
	for j := 0; j < len(c.entries); {
		li := c.lanes[j]
		failed := false
		for ; j < len(c.entries) && c.lanes[j] == li; j++ {
			r := c.results[j]
			switch {
			case r.Kind == Delivered:
				// Even after a failure in this call: the target took
				// it, and sending it again would duplicate it.
			case !failed:
				failed = true
			default:
				r = released
			}
			s.results[c.positions[j]] = r
		}
		l := &s.lanes[li]
		if failed {
			s.stop(l, l.next)
		} else if l.next < l.end {
			s.ready = append(s.ready, li)
		}
	}
	// Answered, the call's entries are not needed any more: dropping them
	// frees their request bodies (a webhook's holds the whole payload) while
	// the rest of the batch is sent, instead of keeping every body of the
	// batch until its last call returns.
	clear(c.entries)
}

// fanOut makes up to limit calls at once while this goroutine packs and
// settles them: a call goes out as soon as one in flight has returned and a
// lane is ready.
//
// The calls run on at most limit workers that live for the whole Publish,
// not a goroutine per call: each new goroutine grew a fresh stack through
// the SDK's middleware chain or net/http, and that stack copying was 11-13%
// of a dispatch bootstrap's CPU under Lambda's share.
func (s *schedule[E]) fanOut(ctx context.Context, limit int) {
	work := make(chan call[E])
	// Room for every call in flight, so a worker never waits to report.
	done := make(chan call[E], limit)
	var workers sync.WaitGroup
	defer func() {
		close(work)
		workers.Wait()
	}()
	started, inFlight := 0, 0
	for {
		for inFlight < limit {
			c, ok := s.nextCall(ctx)
			if !ok {
				break
			}
			if started == inFlight { // every worker is busy: one more
				started++
				workers.Go(func() {
					for c := range work {
						s.b.send(ctx, c)
						done <- c
					}
				})
			}
			work <- c
			inFlight++
		}
		if inFlight == 0 {
			break
		}
		s.settle(<-done)
		inFlight--
	}
}

// cutOff answers what ctx's end left unsent: each lane's next message as
// the context says (or as Prepare refused it), the rest of the lane
// Released.
func (s *schedule[E]) cutOff(ctx context.Context) {
	err := ctx.Err()
	if err == nil {
		return // every lane ran to its end
	}
	canceled, _ := ContextResult(ctx, err)
	for li := range s.lanes {
		l := &s.lanes[li]
		if l.next == l.end {
			continue
		}
		head := canceled
		if l.held != nil && l.held.refused != nil {
			head = *l.held.refused
		}
		s.results[s.order[l.next]] = head
		s.stop(l, l.next+1)
	}
}

// send makes a packed call, and isolates the entry at fault when the
// target refuses the call as a whole for it.
func (b *Batcher[E]) send(ctx context.Context, c call[E]) {
	if b.callOnce(ctx, c.msgs, c.entries, c.results) && len(c.entries) > 1 {
		var stopped []int
		b.isolate(ctx, c, indices(len(c.entries)), &stopped)
	}
}

// isolate re-sends c's entries at idx in parts, in order, until the entry at
// fault is alone in a refused call. A lane that fails in one part (stopped)
// is not sent in the parts after it: its entries there are Released.
func (b *Batcher[E]) isolate(ctx context.Context, c call[E], idx []int, stopped *[]int) {
	for _, part := range b.Isolation.parts(idx) {
		send := make([]int, 0, len(part))
		for _, j := range part {
			if slices.Contains(*stopped, c.lanes[j]) {
				c.results[j] = released
			} else {
				send = append(send, j)
			}
		}
		if len(send) == 0 {
			continue
		}
		msgs, entries, results := make([]*outboxtype.Message, len(send)), make([]E, len(send)), make([]Result, len(send))
		for k, j := range send {
			msgs[k], entries[k] = c.msgs[j], c.entries[j]
		}
		if b.callOnce(ctx, msgs, entries, results) && len(send) > 1 {
			b.isolate(ctx, c, send, stopped)
			continue
		}
		for k, j := range send {
			c.results[j] = results[k]
			if results[k].Kind != Delivered && !slices.Contains(*stopped, c.lanes[j]) {
				*stopped = append(*stopped, c.lanes[j])
			}
		}
	}
}

// callOnce makes one call and answers every entry of it, whatever Call
// does: a call never made once ctx has ended, a panic contained to this
// call's entries, a forgotten entry retryable, and each result timed.
func (b *Batcher[E]) callOnce(ctx context.Context, msgs []*outboxtype.Message, entries []E, results []Result) (isolate bool) {
	if err := ctx.Err(); err != nil {
		r, _ := ContextResult(ctx, err)
		fillResults(results, r)
		return false
	}
	clear(results)
	start := time.Now()
	defer func() {
		took := time.Since(start)
		if v := recover(); v != nil {
			fillResults(results, Retry(outboxtype.CodeTarget5xx, fmt.Errorf("panic while publishing: a call of %d entries: %v", len(entries), v), 0))
			isolate = false
		}
		for j := range results {
			if results[j].Kind == 0 {
				results[j] = Retry(outboxtype.CodeTarget5xx, errUnanswered, 0)
			}
			if results[j].Latency == 0 {
				results[j].Latency = took
			}
		}
	}()
	return b.Call(ctx, msgs, entries, results)
}

func fillResults(results []Result, r Result) {
	for j := range results {
		results[j] = r
	}
}

func indices(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}
