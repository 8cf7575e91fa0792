package statemachine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// option is one step the scheduler may take next.
type option struct {
	name   string
	weight float64
	run    func(ctx context.Context) error
}

// next chooses and sends one step. Only the seeded generator chooses,
// from what the answers so far said.
func (s *sched) next(ctx context.Context) error {
	var opts []option
	add := func(name string, weight float64, run func(ctx context.Context) error) {
		if w, ok := s.cfg.Weights[name]; ok {
			weight *= w
		}
		if weight > 0 {
			opts = append(opts, option{name, weight, run})
		}
	}
	if a := s.pick(idle(s.producers, false)); a != nil {
		add("enqueue", 8, func(ctx context.Context) error { s.produce(ctx, a, "autocommit"); return nil })
		add("begin", 3, func(ctx context.Context) error { s.produce(ctx, a, "begin"); return nil })
	}
	if a := s.pick(idle(s.producers, true)); a != nil {
		add("enqueue in tx", 2, func(ctx context.Context) error { s.produce(ctx, a, "more"); return nil })
		add("end tx", 4, func(ctx context.Context) error { s.endTx(ctx, a, s.rng.Float64() < 0.8); return nil })
	}
	if a := s.pick(idle(s.claimers, false)); a != nil {
		add("claim", 14, func(ctx context.Context) error { s.claim(ctx, a); return nil })
		add("repair", 1.5, func(ctx context.Context) error { s.repair(ctx, a); return nil })
	}
	if a := s.pick(idle(s.completers, false)); a != nil {
		fresh, late, stale := s.completable()
		if len(fresh) > 0 {
			add("complete", 14, func(ctx context.Context) error { s.complete(ctx, a, pickOne(s, fresh), "fresh"); return nil })
			add("complete as another worker", 1, func(ctx context.Context) error {
				s.complete(ctx, a, pickOne(s, fresh), "wrong-worker")
				return nil
			})
		}
		if len(late) > 0 {
			add("complete late", 3, func(ctx context.Context) error { s.complete(ctx, a, pickOne(s, late), "late"); return nil })
		}
		if len(stale) > 0 {
			add("complete again", 2, func(ctx context.Context) error { s.complete(ctx, a, pickOne(s, stale), "stale"); return nil })
		}
	}
	if op := s.operator; !op.busy {
		add("pause", 2, func(ctx context.Context) error { s.pause(ctx, op); return nil })
		if len(s.pauses) > 0 {
			add("resume", 2, func(ctx context.Context) error { s.resume(ctx, op); return nil })
		}
		if len(s.seenDead) > 0 {
			add("replay", 2, func(ctx context.Context) error { s.replay(ctx, op); return nil })
		}
		if len(s.seenDead)+len(s.seenPending) > 0 {
			add("discard", 1.5, func(ctx context.Context) error { s.discard(ctx, op); return nil })
		}
		add("grant", 1, func(ctx context.Context) error { s.grant(ctx, op, true); return nil })
		if s.anyGrant() {
			add("revoke", 1.5, func(ctx context.Context) error { s.grant(ctx, op, false); return nil })
		}
	}
	if inj := s.injector; !inj.busy {
		if len(s.seenPending) > 0 {
			add("lock rows", 4, func(ctx context.Context) error { s.lockRows(ctx, inj); return nil })
		}
		if len(s.seenKeys) > 0 {
			add("lock keys", 1, func(ctx context.Context) error { s.lockKeys(ctx, inj); return nil })
		}
		if inj.inTx {
			add("unlock", 2, func(ctx context.Context) error { s.unlock(ctx, inj, false); return nil })
			add("unlock after expiry", 2, func(ctx context.Context) error { s.unlock(ctx, inj, true); return nil })
		}
	}
	if target, ok := s.nextExpiry(); ok {
		add("wait for expiry", 2, func(ctx context.Context) error { return s.waitUntil(ctx, target) })
	}
	if len(opts) == 0 {
		// Every actor is busy, each waiting on a lock: one of them must
		// be about to be chosen by PostgreSQL's deadlock detector.
		s.logf("every actor waits; waiting for an answer")
		return s.await(ctx)
	}
	total := 0.0
	for _, o := range opts {
		total += o.weight
	}
	x := s.rng.Float64() * total
	for i, o := range opts {
		if x -= o.weight; x < 0 || i == len(opts)-1 {
			s.report.Actions[o.name]++
			return o.run(ctx)
		}
	}
	return nil
}

func idle(list []*actor, inTx bool) []*actor {
	var out []*actor
	for _, a := range list {
		if !a.busy && a.inTx == inTx {
			out = append(out, a)
		}
	}
	return out
}

func (s *sched) pick(list []*actor) *actor {
	if len(list) == 0 {
		return nil
	}
	return list[s.rng.IntN(len(list))]
}

func pickOne[T any](s *sched, list []T) T { return list[s.rng.IntN(len(list))] }

func (s *sched) send() int64 {
	s.tick++
	return s.tick
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// explain is an error as a violation says it: a PostgreSQL error with its
// detail, the sessions it names (a deadlock's) named as the actors.
func (s *sched) explain(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Detail == "" {
		return err.Error()
	}
	detail := pgErr.Detail
	for _, a := range s.actors {
		detail = strings.ReplaceAll(detail, fmt.Sprintf("rocess %d ", a.pid), fmt.Sprintf("rocess %d (%s) ", a.pid, a.name))
		detail = strings.ReplaceAll(detail, fmt.Sprintf("rocess %d.", a.pid), fmt.Sprintf("rocess %d (%s).", a.pid, a.name))
	}
	return fmt.Sprintf("%v: %s", err, strings.ReplaceAll(detail, "\n", " "))
}

func text(v string) pgtype.Text { return pgtype.Text{String: v, Valid: v != ""} }

// ---- Producers ----

// produce enqueues one to three messages in one call: in autocommit, in a
// new transaction left open, or in the producer's open transaction. The
// messages of one call (and of one transaction) share one ordering key, or
// have none, so that producers never wait for each other in a cycle.
func (s *sched) produce(ctx context.Context, p *actor, mode string) {
	g := s.grants[p.role]
	ns, key := p.txNS, p.txKey
	if mode != "more" {
		allowed := namespaces
		if g.ever && len(g.ns) > 0 {
			allowed = sortedKeys(g.ns)
		}
		ns = pickOne(s, allowed)
		if s.rng.Float64() < 0.2 {
			ns = pickOne(s, namespaces)
		}
		key = ""
		if s.rng.Float64() < 0.65 {
			key = pickOne(s, keys)
		}
	}
	n := 1 + s.rng.IntN(3)
	nss, tps, payloads := make([]string, n), make([]string, n), make([]string, n)
	dks, oks := make([]pgtype.Text, n), make([]pgtype.Text, n)
	for i := range n {
		nss[i], tps[i] = ns, pickOne(s, topics)
		payloads[i] = fmt.Sprintf(`{"producer": %q, "n": %d}`, p.name, s.tick*10+int64(i))
		oks[i] = text(key)
		switch x := s.rng.Float64(); {
		case x < 0.15:
			dk := fmt.Sprintf("%s-d%d", p.name, len(s.dedupe[p.name]))
			s.dedupe[p.name] = append(s.dedupe[p.name], dk)
			dks[i] = text(dk)
		case x < 0.2 && len(s.dedupe[p.name]) > 0:
			dks[i] = text(pickOne(s, s.dedupe[p.name]))
		}
	}
	allowed, grantsThen := g.allows(ns), g.String()
	doing := fmt.Sprintf("enqueue %d into %s key %q (%s)", n, ns, key, mode)
	if mode == "begin" {
		p.inTx, p.txNS, p.txKey = true, ns, key
	}
	s.start(ctx, p, doing, func(ctx context.Context) func(int64) {
		type row struct {
			id       uuid.UUID
			seq      pgtype.Int8
			inserted bool
		}
		var q interface {
			Query(context.Context, string, ...any) (pgx.Rows, error)
		} = p.conn
		var err error
		if mode == "begin" {
			p.tx, err = p.conn.Begin(ctx)
		}
		if p.tx != nil {
			q = p.tx
		}
		var got []row
		if err == nil {
			var rows pgx.Rows
			rows, err = q.Query(ctx, `SELECT message_id, sequence_id, inserted
				FROM outbox.enqueue_batch($1::text[], $2::text[], $3::text[], NULL, $4::text[], $5::text[])`,
				nss, tps, payloads, dks, oks)
			if err == nil {
				got, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
					var x row
					err := r.Scan(&x.id, &x.seq, &x.inserted)
					return x, err
				})
			}
		}
		rolledBack := false
		if err != nil && p.tx != nil {
			// A refused enqueue aborts the transaction: end it.
			_ = p.tx.Rollback(context.Background())
			p.tx, rolledBack = nil, true
		}
		return func(int64) {
			switch {
			case err == nil && !allowed:
				s.violate(InvNothingLost, "producer %s (%s) enqueued into namespace %s: want refused with 42501 (messages %v)",
					p.role, grantsThen, ns, idsOf(got, func(r row) uuid.UUID { return r.id }))
			case sqlstate(err) == "42501" && allowed:
				s.violate(InvNothingLost, "producer %s (%s) refused namespace %s: %v", p.role, grantsThen, ns, err)
			case err != nil && sqlstate(err) != "42501":
				s.violate(InvCallFailed, "producer %s: enqueue into %s key %q: %v", p.role, ns, key, s.explain(err))
			}
			if rolledBack {
				for _, m := range p.txMsgs {
					m.state = msgRolledBack
				}
				p.txMsgs, p.inTx = nil, false
			}
			if err != nil {
				return
			}
			for i, r := range got {
				if !r.inserted {
					continue
				}
				m := &message{id: r.id, ns: ns, topic: tps[i], key: key, seq: r.seq.Int64, producer: p.role, state: msgCommitted}
				if p.inTx {
					m.state = msgInTx
					p.txMsgs = append(p.txMsgs, m)
				}
				s.msgs[m.id] = m
			}
		}
	})
}

func idsOf[T any](list []T, id func(T) uuid.UUID) []string {
	out := make([]string, len(list))
	for i, x := range list {
		out[i] = id(x).String()
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		if v {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// endTx commits (or rolls back) a producer's open transaction.
func (s *sched) endTx(ctx context.Context, p *actor, commit bool) {
	msgs := p.txMsgs
	if commit {
		for _, m := range msgs {
			m.state = msgCommitting
		}
	}
	doing := "rollback"
	if commit {
		doing = "commit"
	}
	s.start(ctx, p, fmt.Sprintf("%s (%d messages, key %q)", doing, len(msgs), p.txKey), func(ctx context.Context) func(int64) {
		var err error
		if commit {
			err = p.tx.Commit(ctx)
		} else {
			err = p.tx.Rollback(ctx)
		}
		p.tx = nil
		return func(int64) {
			p.inTx, p.txMsgs = false, nil
			state := msgRolledBack
			if commit && err == nil {
				state = msgCommitted
			}
			for _, m := range msgs {
				m.state = state
			}
			if err != nil {
				s.violate(InvCallFailed, "producer %s: %s: %v", p.role, doing, s.explain(err))
			}
		}
	})
}

// ---- Dispatchers ----

type claimed struct {
	id      uuid.UUID
	attempt int32
	token   uuid.UUID
	expires time.Time
}

func (s *sched) claim(ctx context.Context, a *actor) {
	s.nClaim++
	s.report.Claims++
	c := &claim{n: s.nClaim, worker: fmt.Sprintf("%s/c%d", a.name, s.nClaim), busy: map[string]int{}}
	batch := 1 + s.rng.IntN(8)
	run := 1
	if s.rng.Float64() < 0.75 {
		run = 2 + s.rng.IntN(5)
	}
	c.leaseSecs = 1 + s.rng.IntN(s.cfg.MaxLeaseSeconds)
	var filter []string
	if s.rng.Float64() < 0.25 {
		filter = []string{pickOne(s, namespaces)}
	}
	maxAttempts := 100
	if s.rng.Float64() < 0.2 {
		maxAttempts = 3
	}
	c.sentAt = s.send()
	s.claims[c.worker] = c
	doing := fmt.Sprintf("claim %s: batch %d, run %d, lease %d s, namespaces %v, max attempts %d", c.worker, batch, run, c.leaseSecs, filter, maxAttempts)
	s.start(ctx, a, doing, func(ctx context.Context) func(int64) {
		rows, err := a.conn.Query(ctx, `SELECT id, attempt_count, lease_token, lease_expires_at
			FROM outbox.claim_batch($1, $2, $3, $4, p_max_run => $5, p_max_attempts => $6)`,
			batch, c.worker, c.leaseSecs, filter, run, maxAttempts)
		var got []claimed
		if err == nil {
			got, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
				var x claimed
				err := r.Scan(&x.id, &x.attempt, &x.token, &x.expires)
				return x, err
			})
		}
		return func(recvAt int64) {
			c.recvAt = recvAt
			if err != nil {
				s.violate(InvCallFailed, "claim %s: %v", c.worker, s.explain(err))
				return
			}
			s.claimed(c, got)
		}
	})
}

// claimed records a claim's answer and checks it against what came before
// (invariants 2 and 3).
func (s *sched) claimed(c *claim, got []claimed) {
	if len(got) == 0 {
		s.logf("  %s claimed nothing", c.worker)
		return
	}
	c.token, c.expires = got[0].token, got[0].expires
	c.now = c.expires.Add(-time.Duration(c.leaseSecs) * time.Second)
	s.tokens[c.token] = c
	s.claimList = append(s.claimList, c)
	heads := map[string]int64{}
	for _, x := range got {
		m := s.msgs[x.id]
		if m == nil {
			s.violate(InvNothingLost, "claim %s returned message %s, which no producer of this run enqueued", c.worker, x.id)
			continue
		}
		if x.token != c.token || !x.expires.Equal(c.expires) {
			s.violate(InvOneLeasePerKey, "claim %s returned %s under token %s expiring %s, the rest of the claim under %s expiring %s",
				c.worker, m, x.token, x.expires, c.token, c.expires)
		}
		r := &claimRow{m: m, c: c, attempt: x.attempt}
		c.rows = append(c.rows, r)
		m.rows = append(m.rows, r)
		if k := keyOf(m.ns, m.key); k != "" {
			if h, ok := heads[k]; !ok || m.seq < h {
				heads[k] = m.seq
			}
		}
	}
	var parts []string
	for _, r := range c.rows {
		if k := keyOf(r.m.ns, r.m.key); k != "" {
			r.follower = r.m.seq > heads[k]
			parts = append(parts, fmt.Sprintf("%s#%d", k, r.m.seq))
		} else {
			parts = append(parts, shortName(r.m))
		}
	}
	s.logf("  %s claimed %d until %s: %s", c.worker, len(c.rows), c.expires.Format("15:04:05.000"), strings.Join(parts, " "))

	for _, r := range c.rows {
		s.checkPaused(c, r)
	}
}

func (s *sched) repair(ctx context.Context, a *actor) {
	worker := "reaper-" + a.name
	s.start(ctx, a, "repair expired leases as "+worker, func(ctx context.Context) func(int64) {
		var n int
		err := a.conn.QueryRow(ctx, `SELECT outbox.repair_expired_leases(100, $1)`, worker).Scan(&n)
		return func(int64) {
			if err != nil {
				s.violate(InvCallFailed, "repair_expired_leases as %s: %v", worker, s.explain(err))
				return
			}
			s.logf("  %s requeued %d", worker, n)
		}
	})
}

// completable lists the claims a completion may name: with messages not
// yet completed whose lease is live (fresh) or expired (late) by the
// database's clock at the last check, and with messages already answered
// (stale: completing them again must be refused).
func (s *sched) completable() (fresh, late, stale []*claim) {
	for _, c := range s.claimList {
		open, answered := false, false
		for _, r := range c.rows {
			if r.namedAt == 0 && !r.ended && c.busy[r.group()] == 0 {
				open = true
			}
			if r.ended {
				answered = true
			}
		}
		switch {
		case open && c.expires.After(s.dbNow.Add(100*time.Millisecond)):
			fresh = append(fresh, c)
		case open && !c.expires.After(s.dbNow):
			late = append(late, c)
		}
		if answered {
			stale = append(stale, c)
		}
	}
	return fresh, late, stale
}

// complete sends one completion of a claim's messages. fresh and late
// completions name what a dispatcher would: per key, a prefix of the
// messages not yet completed (the whole run, mostly), delivered in order
// up to a first failure (RETRYABLE, or FAILED with on_dead skip or park)
// after which the rest is RELEASED; unordered messages each have their own
// outcome. stale ones name messages already answered, with any outcome;
// wrong-worker ones name a live lease's messages under another worker.
func (s *sched) complete(ctx context.Context, a *actor, c *claim, kind string) {
	s.nCompletion++
	s.report.Completions++
	comp := &completion{n: s.nCompletion, c: c, worker: c.worker, kind: kind}
	switch kind {
	case "fresh", "late", "wrong-worker":
		groups := map[string][]*claimRow{}
		var order []string
		for _, r := range c.rows {
			k := r.group()
			if r.namedAt != 0 || r.ended || c.busy[k] > 0 {
				continue
			}
			if _, ok := groups[k]; !ok {
				order = append(order, k)
			}
			groups[k] = append(groups[k], r)
		}
		for _, k := range order {
			g := groups[k]
			sort.Slice(g, func(i, j int) bool { return g[i].m.seq < g[j].m.seq })
			if kind == "wrong-worker" {
				for _, r := range g {
					comp.items = append(comp.items, compItem{r: r, outcome: "DISPATCHED"})
				}
				continue
			}
			if len(g) > 1 && s.rng.Float64() < 0.15 {
				g = g[:1+s.rng.IntN(len(g)-1)] // a prefix, the rest later
			}
			failAt, fail, onDead := len(g), "", ""
			if x := s.rng.Float64(); x < 0.3 {
				failAt = s.rng.IntN(len(g))
				switch y := s.rng.Float64(); {
				case y < 0.55:
					fail = "RETRYABLE"
				case y < 0.75:
					fail, onDead = "FAILED", "skip"
				case y < 0.85:
					fail, onDead = "FAILED", "park"
				default:
					fail = "RELEASED"
				}
			}
			for i, r := range g {
				switch {
				case i < failAt:
					comp.items = append(comp.items, compItem{r: r, outcome: "DISPATCHED"})
				case i == failAt:
					comp.items = append(comp.items, compItem{r: r, outcome: fail, onDead: onDead})
				default:
					comp.items = append(comp.items, compItem{r: r, outcome: "RELEASED"})
				}
			}
		}
		if kind == "wrong-worker" {
			comp.worker = "intruder-" + c.worker
			if len(s.claimList) > 1 && s.rng.Float64() < 0.5 {
				if o := pickOne(s, s.claimList); o != c {
					comp.worker = o.worker
				}
			}
		}
	case "stale":
		var done []*claimRow
		for _, r := range c.rows {
			if r.ended {
				done = append(done, r)
			}
		}
		s.rng.Shuffle(len(done), func(i, j int) { done[i], done[j] = done[j], done[i] })
		for _, r := range done[:1+s.rng.IntN(len(done))] {
			out := []string{"DISPATCHED", "DISPATCHED", "RETRYABLE", "FAILED", "RELEASED"}[s.rng.IntN(5)]
			comp.items = append(comp.items, compItem{r: r, outcome: out})
		}
	}
	maxAttempts := 100
	if s.rng.Float64() < 0.2 {
		maxAttempts = 3
	}
	n := len(comp.items)
	ids, tokens := make([]uuid.UUID, n), make([]uuid.UUID, n)
	outcomes, codes, onDead := make([]string, n), make([]pgtype.Text, n), make([]pgtype.Text, n)
	retryAt := make([]pgtype.Timestamptz, n)
	var parts []string
	for i, it := range comp.items {
		ids[i], tokens[i], outcomes[i], onDead[i] = it.r.m.id, c.token, it.outcome, text(it.onDead)
		switch it.outcome {
		case "RETRYABLE":
			codes[i] = text("TARGET_5XX")
			if s.rng.Float64() < 0.5 {
				retryAt[i] = pgtype.Timestamptz{Time: time.Now().Add(300 * time.Millisecond), Valid: true}
			}
		case "FAILED":
			codes[i] = text("TARGET_REJECTED")
		}
		parts = append(parts, fmt.Sprintf("%s:%s", shortName(it.r.m), it.outcome))
	}
	comp.sentAt = s.send()
	if kind != "wrong-worker" {
		for _, it := range comp.items {
			if it.r.namedAt == 0 {
				it.r.namedAt = comp.sentAt
			}
		}
	}
	s.completions = append(s.completions, comp)
	named := map[string]bool{}
	for _, it := range comp.items {
		named[it.r.group()] = true
	}
	for g := range named {
		c.busy[g]++
	}
	doing := fmt.Sprintf("complete %d (%s) of %s as %s, max attempts %d: %s", comp.n, kind, c.worker, comp.worker, maxAttempts, strings.Join(parts, " "))
	s.start(ctx, a, doing, func(ctx context.Context) func(int64) {
		var t0 time.Time
		err := a.conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t0)
		status := map[uuid.UUID]string{}
		if err == nil {
			var rows pgx.Rows
			rows, err = a.conn.Query(ctx, `SELECT id, status FROM outbox.complete_batch($1, NULL, $2,
				p_ids => $3, p_lease_tokens => $4, p_outcomes => $5, p_error_codes => $6, p_retry_at => $7, p_on_dead => $8)`,
				comp.worker, maxAttempts, ids, tokens, outcomes, codes, retryAt, onDead)
			if err == nil {
				var id uuid.UUID
				var st string
				_, err = pgx.ForEachRow(rows, []any{&id, &st}, func() error { status[id] = st; return nil })
			}
		}
		return func(recvAt int64) {
			for g := range named {
				c.busy[g]--
			}
			comp.recvAt, comp.t0, comp.err = recvAt, t0, err
			if err != nil {
				s.violate(InvCallFailed, "completion %d (%s) of %s as %s: %v", comp.n, kind, c.worker, comp.worker, s.explain(err))
				return
			}
			var answers []string
			for i := range comp.items {
				it := &comp.items[i]
				it.status = status[it.r.m.id]
				answers = append(answers, shortName(it.r.m)+":"+it.status)
			}
			s.logf("  completion %d answered %s", comp.n, strings.Join(answers, " "))
			s.completed(comp)
		}
	})
}

func shortName(m *message) string {
	if m.key == "" { // the id's random end: its start is the time
		return m.ns + "/" + m.id.String()[28:]
	}
	return fmt.Sprintf("%s/%s#%d", m.ns, m.key, m.seq)
}

// completed updates which of the claim's messages a later completion may
// still name: a run goes on under its lease only after deliveries.
func (s *sched) completed(comp *completion) {
	if comp.kind == "wrong-worker" {
		return
	}
	endKey := map[string]bool{}
	for _, it := range comp.items {
		it.r.ended = true
		if k := keyOf(it.r.m.ns, it.r.m.key); k != "" && (it.outcome != "DISPATCHED" || it.status != "ok") {
			endKey[k] = true
		}
	}
	for _, r := range comp.c.rows {
		if endKey[keyOf(r.m.ns, r.m.key)] {
			r.ended = true
		}
	}
}

// ---- The operator ----

func (s *sched) pause(ctx context.Context, op *actor) {
	ns, topic := pickOne(s, namespaces), "*"
	if s.rng.Float64() < 0.6 {
		topic = pickOne(s, topics)
	}
	name := ns + "/" + topic
	if p, ok := s.pauses[name]; ok {
		s.resumeOne(ctx, op, p)
		return
	}
	var arg pgtype.Text
	if topic != "*" {
		arg = text(topic)
	}
	reason := fmt.Sprintf("seed %d step %d", s.cfg.Seed, s.step)
	s.start(ctx, op, "pause "+name, func(ctx context.Context) func(int64) {
		var n int64
		err := op.conn.QueryRow(ctx, `SELECT outbox.pause($1, $2, 'statemachine', $3)`, ns, arg, reason).Scan(&n)
		return func(recvAt int64) {
			switch {
			case err == nil:
				p := &pause{ns: ns, topic: topic, recvAt: recvAt}
				s.pauses[name] = p
				s.allPauses = append(s.allPauses, p)
				s.logf("  paused %s (%d marked)", name, n)
			case sqlstate(err) == "P7005": // the namespace is paused as a whole
			default:
				s.violate(InvCallFailed, "pause %s: %v", name, s.explain(err))
			}
		}
	})
}

func (s *sched) resume(ctx context.Context, op *actor) {
	names := make([]string, 0, len(s.pauses))
	for name := range s.pauses {
		names = append(names, name)
	}
	sort.Strings(names)
	s.resumeOne(ctx, op, s.pauses[pickOne(s, names)])
}

func (s *sched) resumeOne(ctx context.Context, op *actor, p *pause) {
	name := p.ns + "/" + p.topic
	p.resumeSentAt = s.send()
	delete(s.pauses, name)
	var arg pgtype.Text
	if p.topic != "*" {
		arg = text(p.topic)
	}
	reason := fmt.Sprintf("seed %d step %d", s.cfg.Seed, s.step)
	s.start(ctx, op, "resume "+name, func(ctx context.Context) func(int64) {
		var n int64
		err := op.conn.QueryRow(ctx, `SELECT outbox.resume($1, $2, 'statemachine', $3)`, p.ns, arg, reason).Scan(&n)
		return func(recvAt int64) {
			switch {
			case err == nil:
				s.logf("  resumed %s (%d unmarked)", name, n)
			case sqlstate(err) == "55P03":
				// Rows stayed locked (the injector): nothing was resumed,
				// the pause is in force again from here on.
				again := &pause{ns: p.ns, topic: p.topic, recvAt: recvAt}
				s.pauses[name] = again
				s.allPauses = append(s.allPauses, again)
			default:
				s.violate(InvCallFailed, "resume %s: %v", name, s.explain(err))
			}
		}
	})
}

func (s *sched) replay(ctx context.Context, op *actor) {
	ids := s.some(s.seenDead, 3)
	s.start(ctx, op, fmt.Sprintf("replay %d dead letters", len(ids)), func(ctx context.Context) func(int64) {
		rows, err := op.conn.Query(ctx, `SELECT message_id FROM outbox.replay_dead(p_message_ids => $1, p_max_rows => 100,
			p_dry_run => false, p_operator => 'statemachine', p_reason => 'replayed by the schedule')`, ids)
		var got []uuid.UUID
		if err == nil {
			got, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		}
		return func(recvAt int64) {
			if err != nil {
				s.violate(InvCallFailed, "replay_dead %v: %v", ids, s.explain(err))
				return
			}
			var names []string
			for _, id := range got {
				if m := s.msgs[id]; m != nil {
					s.replayed(m, recvAt)
					names = append(names, shortName(m))
				}
			}
			s.logf("  replayed %d: %s", len(got), strings.Join(names, " "))
		}
	})
}

func (s *sched) discard(ctx context.Context, op *actor) {
	var ids []uuid.UUID
	if len(s.seenDead) > 0 && (len(s.seenPending) == 0 || s.rng.Float64() < 0.4) {
		ids = s.some(s.seenDead, 2)
	} else {
		ids = s.some(s.seenPending, 2)
	}
	s.start(ctx, op, fmt.Sprintf("discard %d", len(ids)), func(ctx context.Context) func(int64) {
		rows, err := op.conn.Query(ctx, `SELECT message_id FROM outbox.discard($1, 'discarded by the schedule', 'statemachine')`, ids)
		var got []uuid.UUID
		if err == nil {
			got, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		}
		return func(int64) {
			if err != nil {
				s.violate(InvCallFailed, "discard %v: %v", ids, s.explain(err))
				return
			}
			s.logf("  discarded %d", len(got))
		}
	})
}

func (s *sched) anyGrant() bool {
	for _, g := range s.grants {
		if len(g.ns) > 0 {
			return true
		}
	}
	return false
}

// grant grants a producer a namespace, or revokes one it has.
func (s *sched) grant(ctx context.Context, op *actor, give bool) {
	var role, ns string
	if give {
		role, ns = pickOne(s, s.producers).role, pickOne(s, namespaces)
	} else {
		var held [][2]string
		for _, p := range s.producers {
			for _, n := range sortedKeys(s.grants[p.role].ns) {
				held = append(held, [2]string{p.role, n})
			}
		}
		h := pickOne(s, held)
		role, ns = h[0], h[1]
	}
	fn, doing := "grant_namespace", "grant "+ns+" to "+role
	if !give {
		fn, doing = "revoke_namespace", "revoke "+ns+" from "+role
	}
	s.start(ctx, op, doing, func(ctx context.Context) func(int64) {
		_, err := op.conn.Exec(ctx, `SELECT outbox.`+fn+`($1, $2, 'statemachine', 'the schedule')`, role, ns)
		return func(int64) {
			if err != nil {
				s.violate(InvCallFailed, "%s: %v", doing, s.explain(err))
				return
			}
			g := s.grants[role]
			if give {
				g.ever, g.ns[ns] = true, true
			} else {
				delete(g.ns, ns)
			}
		}
	})
}

// some picks up to n distinct ids.
func (s *sched) some(from []uuid.UUID, n int) []uuid.UUID {
	list := append([]uuid.UUID(nil), from...)
	s.rng.Shuffle(len(list), func(i, j int) { list[i], list[j] = list[j], list[i] })
	return list[:min(len(list), 1+s.rng.IntN(n))]
}

// ---- The lock injector ----

var lockModes = []string{"FOR UPDATE", "FOR NO KEY UPDATE", "FOR KEY SHARE"}

// lockRows locks one to three pending rows, mostly of live leases (the
// completions of which will wait), in the injector's transaction (opened
// if need be), skipping rows someone else holds.
func (s *sched) lockRows(ctx context.Context, inj *actor) {
	var live []uuid.UUID
	for _, c := range s.claimList {
		if c.expires.After(s.dbNow) {
			for _, r := range c.rows {
				if !r.ended {
					live = append(live, r.m.id)
				}
			}
		}
	}
	from := s.seenPending
	if len(live) > 0 && s.rng.Float64() < 0.75 {
		from = live
	}
	ids := s.some(from, 3)
	s.lockIn(ctx, inj, pickOne(s, lockModes), fmt.Sprintf("lock %d pending rows", len(ids)),
		`SELECT id::text FROM outbox.pending WHERE id = ANY ($1) ORDER BY id %s SKIP LOCKED`, []any{ids}, true)
}

// lockKeys locks one or two rows of outbox.keys, which producers (at
// commit), operators and settling dispatchers take.
func (s *sched) lockKeys(ctx context.Context, inj *actor) {
	var nss, oks []string
	list := append([][2]string(nil), s.seenKeys...)
	s.rng.Shuffle(len(list), func(i, j int) { list[i], list[j] = list[j], list[i] })
	for _, k := range list[:min(len(list), 1+s.rng.IntN(2))] {
		nss, oks = append(nss, k[0]), append(oks, k[1])
	}
	mode := []string{"FOR UPDATE", "FOR KEY SHARE"}[s.rng.IntN(2)]
	s.lockIn(ctx, inj, mode, fmt.Sprintf("lock keys %v %v", nss, oks),
		`SELECT namespace || '/' || ordering_key FROM outbox.keys
		 WHERE (namespace, ordering_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
		 ORDER BY 1 %s SKIP LOCKED`, []any{nss, oks}, false)
}

func (s *sched) lockIn(ctx context.Context, inj *actor, mode, what, query string, args []any, rows bool) {
	l := inj.locks
	if l == nil || !inj.inTx {
		l = &injected{n: len(s.locks) + 1, rows: map[uuid.UUID]bool{}}
		s.locks = append(s.locks, l)
	}
	inj.locks = l
	inj.inTx = true
	s.start(ctx, inj, fmt.Sprintf("%s %s (lock transaction %d)", what, mode, l.n), func(ctx context.Context) func(int64) {
		var err error
		if inj.tx == nil {
			inj.tx, err = inj.conn.Begin(ctx)
		}
		var got []string
		if err == nil {
			var r pgx.Rows
			r, err = inj.tx.Query(ctx, fmt.Sprintf(query, mode), args...)
			if err == nil {
				got, err = pgx.CollectRows(r, pgx.RowTo[string])
			}
		}
		return func(recvAt int64) {
			if err != nil {
				s.violate(InvCallFailed, "the lock injector: %v", s.explain(err))
				return
			}
			for _, x := range got {
				if rows {
					id := uuid.MustParse(x)
					if !l.rows[id] {
						l.rows[id] = true
						l.acquired = append(l.acquired, lockedRow{id: id, mode: mode, at: recvAt})
					}
				} else {
					l.keys = append(l.keys, x)
				}
			}
			s.logf("  locked %d: %v", len(got), got)
		}
	})
}

// unlock commits the injector's transaction, noting the database's clock
// just before; afterExpiry first waits until every live lease it holds up
// has expired.
func (s *sched) unlock(ctx context.Context, inj *actor, afterExpiry bool) {
	l := inj.locks
	var until time.Time
	if afterExpiry {
		for _, c := range s.claimList {
			for _, r := range c.rows {
				if l.rows[r.m.id] && !r.ended && c.expires.After(until) {
					until = c.expires
				}
			}
		}
	}
	doing := fmt.Sprintf("release lock transaction %d", l.n)
	if !until.IsZero() {
		doing += " after " + until.Format("15:04:05.000")
	}
	s.start(ctx, inj, doing, func(ctx context.Context) func(int64) {
		var err error
		var at time.Time
		if !until.IsZero() {
			err = pollClock(ctx, inj.conn, until)
		}
		if err == nil {
			err = inj.conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at)
		}
		if err == nil {
			err = inj.tx.Commit(ctx)
		} else {
			_ = inj.tx.Rollback(context.Background())
		}
		inj.tx = nil
		return func(int64) {
			inj.inTx, inj.locks = false, nil
			l.released, l.releasedAt = true, at
			if err != nil {
				s.violate(InvCallFailed, "the lock injector: release: %v", s.explain(err))
			}
		}
	})
}

// pollClock polls the database's clock until it is past t. Leases are
// measured by that clock, so a wait for an expiry polls it rather than
// sleeping for the lease's length.
func pollClock(ctx context.Context, conn *pgx.Conn, t time.Time) error {
	for {
		var past bool
		if err := conn.QueryRow(ctx, `SELECT clock_timestamp() > $1`, t).Scan(&past); err != nil || past {
			return err
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// nextExpiry is the earliest expiry, after the database's clock at the
// last check, of a lease the model still sees in use.
func (s *sched) nextExpiry() (time.Time, bool) {
	var t time.Time
	for _, c := range s.claimList {
		if !c.expires.After(s.dbNow) || (!t.IsZero() && !c.expires.Before(t)) {
			continue
		}
		for _, r := range c.rows {
			if !r.ended {
				t = c.expires
				break
			}
		}
	}
	return t, !t.IsZero()
}

// waitUntil lets the database's clock pass t (a lease's expiry) while the
// actors hold what they hold.
func (s *sched) waitUntil(ctx context.Context, t time.Time) error {
	s.logf("wait until %s", t.Format("15:04:05.000"))
	if err := pollClock(ctx, s.checker, t); err != nil {
		return fmt.Errorf("statemachine: wait for a lease's expiry: %w", err)
	}
	return nil
}
