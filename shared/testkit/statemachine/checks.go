package statemachine

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The checks after every step: those of the answers (a claim's against
// the pauses and the leases before it, a completion's against its lease),
// and those of the database's state, read in one snapshot.

type pendingRow struct {
	id         uuid.UUID
	ns, key    string
	seq        int64
	token      pgtype.UUID
	worker     string
	expires    pgtype.Timestamptz
	runThrough int64
	live       bool
}

type archived struct {
	id      int64
	msg     uuid.UUID
	attempt int32
	state   string
	worker  string
	code    string
	ns, key string
	seq     int64
}

func (a archived) String() string {
	who := a.worker
	if who == "" {
		who = "an operator"
	}
	return fmt.Sprintf("%s of attempt %d by %s (archive id %d)", a.state, a.attempt, who, a.id)
}

// check reads the database and checks every invariant.
func (s *sched) check(ctx context.Context) error {
	for _, comp := range s.completions {
		if comp.recvAt != 0 && !comp.checked && comp.err == nil {
			s.checkCompletion(comp)
		}
	}

	tx, err := s.checker.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&s.dbNow); err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	rows, err := tx.Query(ctx, `
		SELECT id, namespace, coalesce(ordering_key, ''), coalesce(sequence_id, 0), lease_token, coalesce(claimed_by, ''),
		       lease_expires_at, coalesce(run_through, 0), coalesce(lease_expires_at > clock_timestamp(), false)
		FROM outbox.pending ORDER BY id`)
	if err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	pending, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pendingRow, error) {
		var p pendingRow
		err := r.Scan(&p.id, &p.ns, &p.key, &p.seq, &p.token, &p.worker, &p.expires, &p.runThrough, &p.live)
		return p, err
	})
	if err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	rows, err = tx.Query(ctx, `SELECT id FROM outbox.dead ORDER BY id`)
	if err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	dead, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	rows, err = tx.Query(ctx, `
		SELECT id, message_id, attempt_no, state, coalesce(worker_id, ''), coalesce(error_code, ''),
		       namespace, coalesce(ordering_key, ''), coalesce(sequence_id, 0)
		FROM outbox.attempts ORDER BY id`)
	if err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	archive, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (archived, error) {
		var a archived
		err := r.Scan(&a.id, &a.msg, &a.attempt, &a.state, &a.worker, &a.code, &a.ns, &a.key, &a.seq)
		return a, err
	})
	if err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	rows, err = tx.Query(ctx, `SELECT namespace, ordering_key FROM outbox.keys ORDER BY 1, 2`)
	if err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	keyRows, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var k [2]string
		err := r.Scan(&k[0], &k[1])
		return k, err
	})
	if err != nil {
		return fmt.Errorf("statemachine: check: %w", err)
	}
	_ = tx.Rollback(ctx)

	s.seenPending = s.seenPending[:0]
	for _, p := range pending {
		s.seenPending = append(s.seenPending, p.id)
	}
	s.seenDead, s.seenKeys = dead, keyRows

	s.checkArchive(archive, pending)
	s.checkLiveClaims()
	s.checkLeases(pending)
	s.checkNothingLost(pending, dead, archive)
	return nil
}

// once reports a violation of the database's state only the first time it
// is seen: it stays in the database for every later check to find.
func (s *sched) once(key string, inv int, format string, args ...any) {
	if s.reported[key] {
		return
	}
	s.reported[key] = true
	s.violate(inv, format, args...)
}

// ---- Invariant 1, from the answers: no written status for a row whose
// lease was not live when the completion could write it. ----

func (s *sched) checkCompletion(comp *completion) {
	// The injected locks each written row waited for: taken on the row
	// before the completion was sent, of a mode its write waits for. The
	// write came after the lock went; until its release is known, the
	// completion waits to be checked.
	type wait struct {
		l  *injected
		lr lockedRow
	}
	waited := make([][]wait, len(comp.items))
	for i, it := range comp.items {
		if it.outcome == "RELEASED" || !written(it.status) {
			continue
		}
		kind := "update"
		if it.outcome != "RETRYABLE" || it.status == "dead" {
			kind = "delete"
		}
		for _, l := range s.locks {
			for _, lr := range l.acquired {
				if lr.id == it.r.m.id && lr.at < comp.sentAt && lr.conflicts(kind) {
					if !l.released {
						return
					}
					waited[i] = append(waited[i], wait{l, lr})
				}
			}
		}
	}
	comp.checked = true
	c := comp.c
	for i, it := range comp.items {
		r := it.r
		if !written(it.status) {
			continue
		}
		if comp.worker != c.worker {
			s.violate(InvStaleWriter, "%s: completion %d under worker %s (the lease is worker %s's, token %s) answered %q to %s",
				r.m, comp.n, comp.worker, c.worker, c.token, it.status, it.outcome)
			continue
		}
		if it.outcome == "RELEASED" {
			continue
		}
		if comp.t0.After(c.expires) {
			s.violate(InvStaleWriter, "%s: completion %d (%s) by worker %s, sent at %s after its lease expired at %s, answered %q to %s",
				r.m, comp.n, comp.kind, comp.worker, comp.t0.Format(timeFormat), c.expires.Format(timeFormat), it.status, it.outcome)
			continue
		}
		for _, w := range waited[i] {
			if w.l.releasedAt.After(c.expires) {
				s.violate(InvStaleWriter, "%s: completion %d (%s) by worker %s answered %q to %s, written after it waited on lock transaction %d (%s, taken before the completion was sent), released at %s, after the lease expired at %s",
					r.m, comp.n, comp.kind, comp.worker, it.status, it.outcome, w.l.n, w.lr.mode,
					w.l.releasedAt.Format(timeFormat), c.expires.Format(timeFormat))
				break
			}
		}
		for _, o := range r.m.rows {
			if o.c != c && o.c.sentAt > c.recvAt && o.c.recvAt != 0 && o.c.recvAt < comp.sentAt {
				s.violate(InvStaleWriter, "%s: completion %d (%s) by worker %s answered %q to %s, sent after worker %s's claim had taken the message (as attempt %d, lease until %s)",
					r.m, comp.n, comp.kind, comp.worker, it.status, it.outcome, o.c.worker, o.attempt, o.c.expires.Format(timeFormat))
				break
			}
		}
	}
}

const timeFormat = "15:04:05.000000"

// ---- Invariants 2 and 3, from a claim's answer. ----

// checkPaused: no claim returns a message of a namespace or topic paused
// (the pause answered) before the claim was sent and not resumed (the
// resume not sent) before it answered.
func (s *sched) checkPaused(c *claim, r *claimRow) {
	for _, p := range s.allPauses {
		if !p.covers(r.m) || p.recvAt >= c.sentAt || (p.resumeSentAt != 0 && p.resumeSentAt < c.recvAt) {
			continue
		}
		how := "as its key's head"
		switch {
		case r.m.key == "":
			how = "unordered"
		case r.follower:
			how = "in the run behind its key's head"
		}
		s.violate(InvPausedClaimed, "claim %s (worker %s) returned %s %s, although %s/%s was paused before the claim was sent and not resumed",
			c.worker, c.worker, r.m, how, p.ns, p.topic)
		return
	}
}

// checkLiveClaims: no two claims hold live leases on one key at once. At
// the database's clock of the check, two claims whose leases are both live
// and that returned messages of one key, neither of which was named in a
// completion since (which may have ended its lease), hold it together.
func (s *sched) checkLiveClaims() {
	byKey := map[string][]*claim{}
	for _, c := range s.claimList {
		if c.recvAt == 0 || !c.expires.After(s.dbNow) {
			continue
		}
		seen := map[string]bool{}
		for _, r := range c.rows {
			if k := keyOf(r.m.ns, r.m.key); k != "" && !seen[k] {
				seen[k] = true
				byKey[k] = append(byKey[k], c)
			}
		}
	}
	for k, claims := range byKey {
		var holders []*claim
		for _, c := range claims {
			completed := false
			for _, r := range c.rows {
				completed = completed || (keyOf(r.m.ns, r.m.key) == k && r.namedAt != 0)
			}
			if !completed {
				holders = append(holders, c)
			}
		}
		if len(holders) < 2 {
			continue
		}
		var parts []string
		for _, c := range holders {
			var rows []*claimRow
			for _, r := range c.rows {
				if keyOf(r.m.ns, r.m.key) == k {
					rows = append(rows, r)
				}
			}
			parts = append(parts, fmt.Sprintf("claim %s (seq %s, from %s until %s)", c.worker, seqs(rows),
				c.now.Format(timeFormat), c.expires.Format(timeFormat)))
		}
		s.once("holders "+k+strings.Join(parts, ","), InvOneLeasePerKey, "key %s is held by %d claims at once, at %s, none of them completed on it: %s",
			k, len(holders), s.dbNow.Format(timeFormat), strings.Join(parts, "; "))
	}
}

func seqs(rows []*claimRow) string {
	var parts []string
	for _, r := range rows {
		parts = append(parts, fmt.Sprint(r.m.seq))
	}
	return strings.Join(parts, ",")
}

// ---- Invariant 2, from outbox.pending. ----

func (s *sched) checkLeases(pending []pendingRow) {
	inFlight := false
	for _, a := range s.claimers {
		inFlight = inFlight || a.busy
	}
	for _, a := range s.completers {
		inFlight = inFlight || a.busy
	}
	live := map[string][]pendingRow{}
	for _, p := range pending {
		if !p.live {
			continue
		}
		if p.key != "" {
			live[keyOf(p.ns, p.key)] = append(live[keyOf(p.ns, p.key)], p)
		}
		c := s.tokens[uuid.UUID(p.token.Bytes)]
		if c == nil {
			if !inFlight { // else a claim may have answered since the settle
				s.once("token "+p.id.String(), InvOneLeasePerKey, "message %s is leased to %s under token %s until %s, which no claim returned",
					s.name(p.id), p.worker, uuid.UUID(p.token.Bytes), p.expires.Time.Format(timeFormat))
			}
			continue
		}
		returned := false
		for _, r := range c.rows {
			returned = returned || r.m.id == p.id
		}
		if !returned || p.worker != c.worker {
			s.once("lease "+p.id.String()+c.worker, InvOneLeasePerKey, "message %s is leased to %s under the token of claim %s (worker %s), which returned it: %v",
				s.name(p.id), p.worker, c.worker, c.worker, returned)
		}
	}
	for k, rows := range live {
		if len(rows) < 2 {
			continue
		}
		var parts []string
		for _, p := range rows {
			cover := fmt.Sprint(p.seq)
			if p.runThrough > 0 {
				cover += fmt.Sprintf("..%d", p.runThrough)
			}
			parts = append(parts, fmt.Sprintf("seq %s by %s until %s", cover, p.worker, p.expires.Time.Format(timeFormat)))
		}
		s.once("leases "+k+strings.Join(parts, ";"), InvOneLeasePerKey, "key %s has %d live leases: %s", k, len(rows), strings.Join(parts, "; "))
	}
}

func (s *sched) name(id uuid.UUID) string {
	if m := s.msgs[id]; m != nil {
		return m.String()
	}
	return id.String() + " (unknown to the run)"
}

// ---- Invariants 1 and 4, from the archive. ----

func (s *sched) replayed(m *message, recvAt int64) { s.replays[m.id] = recvAt }

func (s *sched) checkArchive(archive []archived, pending []pendingRow) {
	// 1. Each attempt of a message ends at most once (a replay starts its
	//    attempts again), and an outcome's attempt is the one its worker's
	//    claim returned.
	epoch := map[uuid.UUID]int{}
	ended := map[string]archived{}
	inFlight := map[string]bool{}
	for w, c := range s.claims {
		if c.recvAt == 0 {
			inFlight[w] = true
		}
	}
	for _, a := range archive {
		switch a.state {
		case "REPLAYED":
			epoch[a.msg]++
			continue
		case "DISPATCHED", "RETRYABLE", "FAILED", "ZOMBIE_REQUEUE":
		default:
			continue
		}
		k := fmt.Sprintf("%s|%d|%d", a.msg, epoch[a.msg], a.attempt)
		if prev, dup := ended[k]; dup {
			s.once("twice "+k, InvStaleWriter, "%s: attempt %d ended twice: %s, then %s", s.name(a.msg), a.attempt, prev, a)
		} else {
			ended[k] = a
		}
		if a.state == "ZOMBIE_REQUEUE" || (a.state == "FAILED" && a.code == "LEASE_EXPIRED") {
			continue // a takeover's record, by the worker that took over
		}
		if inFlight[a.worker] {
			continue
		}
		c := s.claims[a.worker]
		if c == nil {
			s.once(fmt.Sprint("writer ", a.id), InvStaleWriter, "%s: %s, by no claim of this run", s.name(a.msg), a)
			continue
		}
		var row *claimRow
		for _, r := range c.rows {
			if r.m.id == a.msg {
				row = r
			}
		}
		switch {
		case row == nil:
			s.once(fmt.Sprint("writer ", a.id), InvStaleWriter, "%s: %s, whose claim did not return it", s.name(a.msg), a)
		case row.attempt != a.attempt:
			s.once(fmt.Sprint("writer ", a.id), InvStaleWriter, "%s: %s, whose claim returned it as attempt %d (claims of it: %s)",
				s.name(a.msg), a, row.attempt, claimsOf(row.m))
		}
	}

	// 4. Per key, DISPATCHED in sequence order. What skip, park and replay
	//    allow: a message that dies under on_dead skip lets its key move
	//    on without it, so it is never dispatched before its replay; once
	//    replayed it goes as its key's next message, after the messages
	//    then in flight (claimed before the replay answered, whose attempt
	//    the replay does not stop; their retry after a takeover included)
	//    and before every other later one. Under park the key waits for it,
	//    so a replay puts it first. A discarded message is never
	//    dispatched.
	byKey := map[string][]archived{}
	before := func(t archived, later uuid.UUID) bool { // may t precede the replayed message later?
		at, ok := s.replays[later]
		if !ok {
			return false
		}
		if m := s.msgs[t.msg]; m != nil {
			for _, r := range m.rows {
				if r.c.sentAt < at {
					return true
				}
			}
		}
		return false
	}
	for _, a := range archive {
		if a.state != "DISPATCHED" || a.key == "" {
			continue
		}
		k := keyOf(a.ns, a.key)
		for _, t := range byKey[k] {
			if t.seq > a.seq && !before(t, a.msg) {
				s.once(fmt.Sprint("order ", t.id, a.id), InvKeyOrder, "key %s: seq %d was dispatched (%s) after seq %d (%s)",
					k, a.seq, a, t.seq, t)
			}
		}
		byKey[k] = append(byKey[k], a)
	}
	for _, p := range pending {
		if p.key == "" {
			continue
		}
		k := keyOf(p.ns, p.key)
		for _, t := range byKey[k] {
			if t.seq > p.seq && !before(t, p.id) {
				s.once(fmt.Sprint("past ", t.id, p.id), InvKeyOrder, "key %s: seq %d was dispatched (%s) while seq %d is still pending (%s)",
					k, t.seq, t, p.seq, s.name(p.id))
			}
		}
	}
}

func claimsOf(m *message) string {
	var parts []string
	for _, r := range m.rows {
		parts = append(parts, fmt.Sprintf("%s as attempt %d until %s", r.c.worker, r.attempt, r.c.expires.Format(timeFormat)))
	}
	return strings.Join(parts, "; ")
}

// ---- Invariant 5: nothing lost. ----

func (s *sched) checkNothingLost(pending []pendingRow, dead []uuid.UUID, archive []archived) {
	where := map[uuid.UUID][]string{}
	for _, p := range pending {
		where[p.id] = append(where[p.id], "pending")
	}
	for _, id := range dead {
		where[id] = append(where[id], "dead")
	}
	for _, a := range archive {
		switch a.state {
		case "DISPATCHED":
			where[a.msg] = append(where[a.msg], "archived DISPATCHED by "+a.worker)
		case "DISCARDED":
			where[a.msg] = append(where[a.msg], "archived DISCARDED")
		}
	}
	ids := make([]uuid.UUID, 0, len(s.msgs))
	for id := range s.msgs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].String() < ids[j].String() })
	for _, id := range ids {
		m := s.msgs[id]
		places := where[id]
		switch m.state {
		case msgCommitted:
			if len(places) != 1 {
				what := "nowhere: lost"
				if len(places) > 1 {
					what = strings.Join(places, " and ")
				}
				s.once("lost "+id.String()+what, InvNothingLost, "%s, committed by %s, is %s", m, m.producer, what)
			}
		case msgRolledBack, msgInTx:
			if len(places) > 0 {
				s.once("ghost "+id.String(), InvNothingLost, "%s, enqueued by %s in a transaction %s, is %s",
					m, m.producer, map[msgState]string{msgRolledBack: "rolled back", msgInTx: "still open"}[m.state], strings.Join(places, " and "))
			}
		}
		delete(where, id)
	}
	for _, p := range s.producers {
		if p.busy {
			return // an enqueue or a commit may have answered since the settle
		}
	}
	for id, places := range where {
		if places[0] == "pending" || places[0] == "dead" {
			s.once("stranger "+id.String(), InvNothingLost, "message %s is %s, and no producer of this run enqueued it", id, strings.Join(places, " and "))
		}
	}
}
