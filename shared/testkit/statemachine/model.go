package statemachine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
)

// The model is what the harness knows from the answers it got: every
// message a producer enqueued, every claim and what it returned, every
// completion and what it was told, the pauses, the grants and the injected
// locks. Events carry logical times (the scheduler's tick when a call was
// sent and when its answer was taken in), so that "B's claim had answered
// before A's completion was sent" is a fact, not a guess about clocks.

// msgState is where a message stands as far as its producer knows.
type msgState int

const (
	msgInTx       msgState = iota // enqueued in a transaction still open
	msgCommitting                 // its transaction's COMMIT is on its way
	msgCommitted
	msgRolledBack
)

type message struct {
	id        uuid.UUID
	ns, topic string
	key       string // "" for an unordered message
	seq       int64
	producer  string
	state     msgState
	rows      []*claimRow // every claim that returned it, in order
}

func (m *message) String() string {
	if m.key == "" {
		return fmt.Sprintf("%s (%s/%s, unordered)", m.id, m.ns, m.topic)
	}
	return fmt.Sprintf("%s (%s/%s key %s seq %d)", m.id, m.ns, m.topic, m.key, m.seq)
}

// keyOf names a message's ordering key as the database scopes it: by
// namespace. Unordered messages have none ("").
func keyOf(ns, key string) string {
	if key == "" {
		return ""
	}
	return ns + "/" + key
}

type claim struct {
	n         int
	worker    string // unique per claim, so the archive names the claim that wrote
	token     uuid.UUID
	leaseSecs int
	now       time.Time // the claim's clock: its expiry less its lease
	expires   time.Time
	sentAt    int64
	recvAt    int64 // 0 while the claim is in flight
	rows      []*claimRow
	// busy counts, per key (or unordered message), the completions of the
	// claim in flight: a dispatcher records a key's outcomes in order, so
	// the next part of a run waits for the answer about the one before.
	busy map[string]int
}

// group is what a claim's completion names at once: a key's run, or one
// unordered message.
func (r *claimRow) group() string {
	if k := keyOf(r.m.ns, r.m.key); k != "" {
		return k
	}
	return "unordered " + r.m.id.String()
}

// claimRow is one message as one claim returned it.
type claimRow struct {
	m       *message
	c       *claim
	attempt int32
	// follower: returned behind another message of its key in this claim
	// (part of a run), not as a head.
	follower bool
	namedAt  int64 // when a completion under this claim first named it (sent)
	// ended: the lease no longer covers it in the model's view (an outcome
	// other than a delivery was recorded on its key's run, or it was
	// answered); a later completion of it is stale.
	ended bool
}

func (r *claimRow) String() string {
	return fmt.Sprintf("%s as attempt %d of claim %s", r.m, r.attempt, r.c.worker)
}

// completion is one call of outbox.complete_batch.
type completion struct {
	n       int
	c       *claim // the claim whose token it carries
	worker  string // the worker it named (the claim's, unless deliberately wrong)
	kind    string // fresh, late, stale, wrong-worker
	t0      time.Time
	sentAt  int64
	recvAt  int64
	items   []compItem
	checked bool
	err     error
}

type compItem struct {
	r       *claimRow
	outcome string
	onDead  string
	status  string
}

// written reports whether a status says the call wrote the row.
func written(status string) bool {
	return status == "ok" || status == "dead" || status == "double_dispatch"
}

// injected is one transaction of the lock injector.
type injected struct {
	n          int
	rows       map[uuid.UUID]bool
	acquired   []lockedRow
	keys       []string
	released   bool
	releasedAt time.Time // the database's clock just before the COMMIT
}

// lockedRow is a pending row the injector holds.
type lockedRow struct {
	id   uuid.UUID
	mode string // FOR UPDATE, FOR NO KEY UPDATE, FOR KEY SHARE
	at   int64  // when the lock was taken (the answer)
}

// conflicts reports whether the lock makes a write of kind (delete or
// update of columns no unique index has) of the row wait.
func (l lockedRow) conflicts(kind string) bool {
	switch kind {
	case "delete":
		return true
	case "update":
		return l.mode == "FOR UPDATE" || l.mode == "FOR NO KEY UPDATE"
	}
	return false
}

type pause struct {
	ns, topic    string // topic "*" for the whole namespace
	recvAt       int64  // when outbox.pause answered
	resumeSentAt int64  // when outbox.resume was sent (0: in force)
}

func (p *pause) covers(m *message) bool {
	return p.ns == m.ns && (p.topic == "*" || p.topic == m.topic)
}

// grants is one producer login's namespace grants as the operator made
// them.
type grants struct {
	ever bool // granted at least once: confined from then on
	ns   map[string]bool
}

func (g *grants) String() string {
	if !g.ever {
		return "never granted any namespace (unconfined)"
	}
	var list []string
	for ns := range g.ns {
		list = append(list, ns)
	}
	sort.Strings(list)
	if len(list) == 0 {
		return "every grant revoked"
	}
	return "granted " + strings.Join(list, ", ")
}

// allows is whether an enqueue into ns must be accepted.
func (g *grants) allows(ns string) bool { return !g.ever || g.ns[ns] }
