package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Report is a soak's figures: what was injected, and what came out.
type Report struct {
	Config  Config  `json:"-"`
	Machine Machine `json:"machine"`

	Wall            time.Duration `json:"wall"`
	ProduceDuration time.Duration `json:"produce_duration"`
	DrainDuration   time.Duration `json:"drain_duration"`
	Drained         bool          `json:"drained"`
	Postgres        string        `json:"postgres"`
	// Autovacuum is the server's autovacuum setting and naptime.
	Autovacuum string `json:"autovacuum"`

	Producer ProducerCounts `json:"producer"`
	Target   TargetCounts   `json:"target"`
	Fleet    FleetCounts    `json:"fleet"`
	Restarts []Restart      `json:"restarts"`
	// ReadOnlyTurns counts the times the server turned read-only and back.
	ReadOnlyTurns int64 `json:"read_only_turns"`
	// Operator is what outboxctl did; PauseViolations (in it) counts the
	// calls for a paused topic's messages that reached the target while it
	// was paused, but for those in flight at the pause: it must be 0.
	Operator OperatorCounts `json:"operator"`
	// Stuck is the stuck key's window; StuckOthersDelivered the other
	// messages first delivered in it (the others flow), StuckKeyMessages
	// and StuckKeyDelivered the key's own messages and those delivered.
	Stuck                *StuckWindow `json:"stuck,omitempty"`
	StuckOthersDelivered int64        `json:"stuck_others_delivered"`
	StuckKeyMessages     int64        `json:"stuck_key_messages"`
	StuckKeyDelivered    int64        `json:"stuck_key_delivered"`

	// Committed are the messages whose producer transaction committed;
	// LedgerRows the business rows in the database (one per message).
	Committed  int64 `json:"committed"`
	LedgerRows int64 `json:"ledger_rows"`
	// Delivered counts committed messages delivered at least once; Dead
	// those in outbox.dead; DeliveredAndDead both (delivered by a call whose
	// answer was lost, then refused for good on a later attempt).
	Delivered        int64 `json:"delivered_distinct"`
	Dead             int64 `json:"dead"`
	DeliveredAndDead int64 `json:"delivered_and_dead"`
	// Lost counts committed messages neither delivered nor dead.
	Lost    int64 `json:"lost"`
	Pending int64 `json:"pending_at_end"`
	// StillPending describes up to 20 messages still pending at the end,
	// with their keys' state: what a failed drain waited for.
	StillPending []string `json:"still_pending,omitempty"`

	// Deliveries counts every delivery (a call that reached the receiver's
	// deduplication and was answered 200); Duplicates those beyond each
	// message's first.
	Deliveries         int64 `json:"deliveries"`
	Duplicates         int64 `json:"duplicates"`
	DuplicatedMessages int64 `json:"duplicated_messages"`

	// The duplicate bound: the messages in flight when a fault struck.
	LeasedAtKills    int64 `json:"leased_at_kills"`
	LeasedAtRestarts int64 `json:"leased_at_restarts"`
	LeasedAtReadOnly int64 `json:"leased_at_read_only_turns"`
	LeasedAtTakeover int64 `json:"leased_at_takeovers"`
	Orphaned         int64 `json:"orphaned_after_failed_invocations"`
	InFlightAtFaults int64 `json:"in_flight_at_faults_distinct"`
	UnansweredCalls  int64 `json:"unanswered_calls"`
	StaleCompletions int64 `json:"stale_completions_rejected"`
	DuplicateBound   int64 `json:"duplicate_bound"`
	// UnexplainedDuplicates are duplicated messages that no fault can
	// account for: neither leased at a fault, nor requeued after a lease
	// expired, nor sent in a call left unanswered.
	UnexplainedDuplicates int64 `json:"unexplained_duplicates"`
	ZombieRequeues        int64 `json:"zombie_requeues"`

	OrderedMessages int64 `json:"ordered_messages"`
	OrderingKeys    int   `json:"ordering_keys"`
	OrderViolations int64 `json:"order_violations"`
	LateDuplicates  int64 `json:"late_duplicates"`
	SequenceGaps    int64 `json:"sequence_gaps"`

	RolledBackDelivered   int64 `json:"rolled_back_delivered"`
	RolledBackInDatabase  int64 `json:"rolled_back_in_database"`
	UnknownDeliveries     int64 `json:"unknown_deliveries"`
	EnvelopeMismatches    int64 `json:"envelope_mismatches"`
	DispatchedNotReceived int64 `json:"dispatched_not_received"`

	AttemptStates map[string]int64 `json:"attempt_states"`
	DeadCodes     map[string]int64 `json:"dead_by_error_code"`

	// Latency is from the producer's transaction to the first delivery,
	// for messages without and with an ordering key (a key's messages go
	// one at a time, so a retry or a crash holds up the key's later ones).
	Latency        Percentiles `json:"latency_unordered"`
	LatencyOrdered Percentiles `json:"latency_ordered"`
}

// Percentiles of a latency distribution.
type Percentiles struct {
	P50 time.Duration `json:"p50"`
	P99 time.Duration `json:"p99"`
	Max time.Duration `json:"max"`
}

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	n := len(d)
	return Percentiles{P50: d[n/2], P99: d[min(n-1, n*99/100)], Max: d[n-1]}
}

func (p Percentiles) String() string {
	return fmt.Sprintf("p50 %s, p99 %s, max %s", p.P50.Round(time.Millisecond), p.P99.Round(time.Millisecond), p.Max.Round(time.Millisecond))
}

// unansweredCodes are the attempt error codes of calls the dispatcher sent
// but got no answer to: the target may have processed them.
var unansweredCodes = []string{"TIMEOUT", "CANCELED", "NETWORK"}

func (r *Report) account(ctx context.Context, db *pgxpool.Pool, book *ledgerBook, target *Target, flt *fleet, faults *faultLog, op *operator) error {
	book.mu.Lock()
	defer book.mu.Unlock()
	r.Producer = book.stats
	r.Target = target.Counts()
	r.Fleet = flt.Counts()
	r.Restarts = faults.restarts()
	r.Operator = op.Counts()
	pauses := op.Windows()
	if r.Stuck != nil {
		r.Stuck.Duration = r.Stuck.End.Sub(r.Stuck.Start)
	}
	r.Committed = int64(len(book.committed))
	r.StaleCompletions = r.Fleet.LeaseLost

	one := func(sql string, dst any, args ...any) error {
		if err := db.QueryRow(ctx, sql, args...).Scan(dst); err != nil {
			return fmt.Errorf("soak: %s: %w", sql, err)
		}
		return nil
	}
	ids := func(sql string, args ...any) (map[uuid.UUID]int64, error) {
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return nil, fmt.Errorf("soak: %s: %w", sql, err)
		}
		out := map[uuid.UUID]int64{}
		var id uuid.UUID
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] += n; return nil })
		return out, err
	}
	if err := one(`SHOW server_version`, &r.Postgres); err != nil {
		return err
	}
	if err := one(`SELECT current_setting('autovacuum') || ', naptime ' || current_setting('autovacuum_naptime')`, &r.Autovacuum); err != nil {
		return err
	}
	if err := one(`SELECT count(*) FROM shop.ledger`, &r.LedgerRows); err != nil {
		return err
	}
	if err := one(`SELECT count(*) FROM outbox.pending`, &r.Pending); err != nil {
		return err
	}
	if r.Pending > 0 {
		rows, err := db.Query(ctx, `
			SELECT format('%s %s/%s key %s seq %s behind %s paused %s leased %s due in %s attempts %s last %s: %s; key: head %s, parked %s, unsettled %s',
			              p.id, p.namespace, p.topic, coalesce(p.ordering_key, '-'), coalesce(p.sequence_id::text, '-'), p.behind, p.paused,
			              p.lease_token IS NOT NULL, p.next_attempt_at - clock_timestamp(), p.attempt_count,
			              coalesce(p.last_error_code, '-'), left(coalesce(p.last_error, '-'), 120),
			              (SELECT h.id::text FROM outbox.pending h WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key AND NOT h.behind),
			              EXISTS (SELECT 1 FROM outbox.dead d WHERE d.namespace = p.namespace AND d.ordering_key = p.ordering_key AND d.holds_key),
			              EXISTS (SELECT 1 FROM outbox.unsettled_keys u WHERE u.namespace = p.namespace AND u.ordering_key = p.ordering_key))
			FROM outbox.pending p ORDER BY p.id LIMIT 20`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				rows.Close()
				return err
			}
			r.StillPending = append(r.StillPending, line)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	dead, err := ids(`SELECT id, 1 FROM outbox.dead`)
	if err != nil {
		return err
	}
	dispatched, err := ids(`SELECT message_id, 1 FROM outbox.attempts WHERE state = 'DISPATCHED'`)
	if err != nil {
		return err
	}
	unanswered, err := ids(`SELECT message_id, count(*) FROM outbox.attempts WHERE error_code = ANY($1) GROUP BY message_id`, unansweredCodes)
	if err != nil {
		return err
	}
	zombies, err := ids(`SELECT message_id, count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE' GROUP BY message_id`)
	if err != nil {
		return err
	}
	for _, n := range unanswered {
		r.UnansweredCalls += n
	}
	for _, n := range zombies {
		r.ZombieRequeues += n
	}
	r.AttemptStates, err = counts(ctx, db, `SELECT state, count(*) FROM outbox.attempts GROUP BY state`)
	if err != nil {
		return err
	}
	r.DeadCodes, err = counts(ctx, db, `SELECT coalesce(last_error_code, ''), count(*) FROM outbox.dead GROUP BY 1`)
	if err != nil {
		return err
	}
	lastSeq, err := counts(ctx, db, `SELECT ordering_key, last_sequence_id FROM outbox.sequences`)
	if err != nil {
		return err
	}
	var notCommitted []uuid.UUID
	for id := range book.rolledBack {
		notCommitted = append(notCommitted, id)
	}
	for id := range book.notCommitted {
		notCommitted = append(notCommitted, id)
	}
	if err := one(`SELECT count(*) FROM (SELECT message_id AS id FROM outbox.attempts UNION ALL SELECT id FROM outbox.dead
		UNION ALL SELECT id FROM outbox.pending) x WHERE x.id = ANY($1)`, &r.RolledBackInDatabase, notCommitted); err != nil {
		return err
	}

	// Deliveries, in arrival order.
	type keyState struct{ last int64 }
	perKey := map[string]*keyState{}
	got := make(map[uuid.UUID]int32, len(book.committed))
	var latencies, orderedLatencies []time.Duration
	for _, d := range target.Deliveries() {
		switch d.outcome.Load() {
		case outcomeNew, outcomeDuplicate:
		default:
			continue // the sender gave up while a duplicate was held: nothing handled, nothing answered
		}
		r.Deliveries++
		for _, w := range pauses {
			if d.topic == w.Topic && d.arrived.After(w.Start) && d.arrived.Before(w.End) {
				if _, inFlight := w.inFlight[d.id]; !inFlight {
					r.Operator.PauseViolations++
				}
			}
		}
		if s := r.Stuck; s != nil && d.outcome.Load() == outcomeNew && d.orderKey != s.Key &&
			d.received.After(s.Start) && d.received.Before(s.End) {
			r.StuckOthersDelivered++
		}
		msg, known := book.committed[d.id]
		if !known {
			_, rb := book.rolledBack[d.id]
			_, nc := book.notCommitted[d.id]
			if rb || nc {
				r.RolledBackDelivered++
			} else {
				r.UnknownDeliveries++
			}
			continue
		}
		if msg.orderKey != d.orderKey || msg.seq != d.seq {
			r.EnvelopeMismatches++
		}
		first := got[d.id] == 0
		got[d.id]++
		if first && !d.created.IsZero() {
			if msg.orderKey != "" {
				orderedLatencies = append(orderedLatencies, d.received.Sub(d.created))
			} else {
				latencies = append(latencies, d.received.Sub(d.created))
			}
		}
		if msg.orderKey == "" {
			continue
		}
		st := perKey[msg.orderKey]
		if st == nil {
			st = &keyState{}
			perKey[msg.orderKey] = st
		}
		switch {
		case first && msg.seq < st.last:
			// A message first delivered after a later one of its key.
			r.OrderViolations++
		case first:
			st.last = msg.seq
		case msg.seq < st.last:
			r.LateDuplicates++
		}
	}

	seqs := map[string][]int64{}
	for id, m := range book.committed {
		n := got[id]
		_, isDead := dead[id]
		switch {
		case n > 0 && isDead:
			r.Delivered++
			r.Dead++
			r.DeliveredAndDead++
		case n > 0:
			r.Delivered++
		case isDead:
			r.Dead++
		default:
			r.Lost++
		}
		if n > 1 {
			r.Duplicates += int64(n - 1)
			r.DuplicatedMessages++
			_, atFault := flt.inflight.ids[id]
			if !atFault && unanswered[id] == 0 && zombies[id] == 0 {
				r.UnexplainedDuplicates++
			}
		}
		if r.Stuck != nil && m.orderKey == r.Stuck.Key {
			r.StuckKeyMessages++
			if n > 0 {
				r.StuckKeyDelivered++
			}
		}
		if m.orderKey != "" {
			r.OrderedMessages++
			seqs[m.orderKey] = append(seqs[m.orderKey], m.seq)
		}
	}
	for id := range dispatched {
		if got[id] == 0 {
			r.DispatchedNotReceived++
		}
	}
	// Sequence ids per key: 1..n without a gap or a repeat (a rolled-back
	// transaction rolls its allocation back too), and n is the allocator's.
	r.OrderingKeys = len(seqs)
	for key, list := range seqs {
		slices.Sort(list)
		for i, s := range list {
			if s != int64(i+1) {
				r.SequenceGaps++
			}
		}
		if lastSeq[key] != int64(len(list)) {
			r.SequenceGaps++
		}
	}

	flt.inflight.mu.Lock()
	r.LeasedAtKills, r.LeasedAtRestarts, r.Orphaned = flt.inflight.atKills, flt.inflight.atRestarts, flt.inflight.orphans
	r.LeasedAtReadOnly, r.LeasedAtTakeover = flt.inflight.atReadOnly, flt.inflight.atTakeovers
	r.InFlightAtFaults = int64(len(flt.inflight.ids))
	flt.inflight.mu.Unlock()
	r.DuplicateBound = r.InFlightAtFaults + r.UnansweredCalls + r.StaleCompletions

	r.Latency, r.LatencyOrdered = percentiles(latencies), percentiles(orderedLatencies)
	return nil
}

func counts(ctx context.Context, db *pgxpool.Pool, sql string) (map[string]int64, error) {
	rows, err := db.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("soak: %s: %w", sql, err)
	}
	out := map[string]int64{}
	var k string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error { out[k] = n; return nil })
	return out, err
}

// Check returns every guarantee the run broke, and every fault that was
// meant to be injected and was not (a soak without its faults proves
// nothing).
func (r *Report) Check() error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	c := r.Config
	if !r.Drained || r.Pending != 0 {
		fail("the queue did not drain: %d messages pending", r.Pending)
		for _, line := range r.StillPending {
			fail("  still pending: %s", line)
		}
	}
	if r.Committed != int64(c.Messages) {
		fail("producers committed %d messages, want %d", r.Committed, c.Messages)
	}
	if r.LedgerRows != r.Committed {
		fail("the database holds %d ledger rows for %d messages the producers saw committed", r.LedgerRows, r.Committed)
	}
	if r.Lost != 0 {
		fail("LOST: %d committed messages neither delivered nor dead", r.Lost)
	}
	if r.RolledBackDelivered != 0 || r.RolledBackInDatabase != 0 {
		fail("%d rolled-back messages delivered, %d found in the outbox tables", r.RolledBackDelivered, r.RolledBackInDatabase)
	}
	if r.OrderViolations != 0 {
		fail("%d per-key order violations", r.OrderViolations)
	}
	if r.SequenceGaps != 0 {
		fail("%d sequence id gaps or repeats", r.SequenceGaps)
	}
	if r.Duplicates > r.DuplicateBound {
		fail("%d duplicates, over the bound of %d messages in flight at faults", r.Duplicates, r.DuplicateBound)
	}
	if r.UnexplainedDuplicates != 0 {
		fail("%d duplicated messages no fault accounts for", r.UnexplainedDuplicates)
	}
	if r.UnknownDeliveries != 0 || r.EnvelopeMismatches != 0 {
		fail("%d deliveries of messages no producer sent, %d with the wrong ordering key or sequence id", r.UnknownDeliveries, r.EnvelopeMismatches)
	}
	if r.DispatchedNotReceived != 0 {
		fail("%d messages recorded DISPATCHED that the target never received", r.DispatchedNotReceived)
	}
	if r.Fleet.DoubleDispatch != 0 {
		fail("the double-delivery backstop fired %d times", r.Fleet.DoubleDispatch)
	}
	if r.Producer.AtomicityViolations != 0 || r.Producer.ReEnqueueInserted != 0 {
		fail("%d torn producer transactions, %d dedupe-key re-enqueues that wrote a new message", r.Producer.AtomicityViolations, r.Producer.ReEnqueueInserted)
	}
	// The faults themselves.
	if r.Fleet.Kills < int64(c.Kills) {
		fail("only %d of %d kills happened", r.Fleet.Kills, c.Kills)
	}
	if len(r.Restarts) < c.PGRestarts {
		fail("only %d of %d PostgreSQL restarts happened", len(r.Restarts), c.PGRestarts)
	}
	o := r.Operator
	if o.PauseViolations != 0 {
		fail("%d calls for paused messages reached the target before their resume", o.PauseViolations)
	}
	if o.Pauses < int64(c.Pauses) {
		fail("only %d of %d pauses happened", o.Pauses, c.Pauses)
	} else if c.Pauses > 0 && o.PausedHeld == 0 {
		fail("the pauses held no message")
	}
	if c.FailRate > 0 && c.ReplayEvery > 0 && o.Replayed == 0 {
		fail("no dead letter was replayed")
	}
	if c.FailRate > 0 && o.ParkedReleased == 0 {
		fail("no parked key was released")
	}
	if c.StuckFor > 0 {
		switch {
		case r.Stuck == nil:
			fail("the stuck key never was")
		case r.Target.StuckRefused == 0:
			fail("the stuck key %s had nothing refused", r.Stuck.Key)
		case r.StuckOthersDelivered == 0:
			fail("nothing else was delivered while %s was stuck", r.Stuck.Key)
		}
	}
	if r.Fleet.Takeovers < int64(c.Takeovers) {
		fail("only %d of %d lease takeovers happened", r.Fleet.Takeovers, c.Takeovers)
	} else if r.Fleet.TakenOver == 0 && c.Takeovers > 0 {
		fail("no row of a stopped dispatcher was taken over")
	}
	if r.ReadOnlyTurns < int64(c.ReadOnlyTurns) {
		fail("only %d of %d read-only turns happened", r.ReadOnlyTurns, c.ReadOnlyTurns)
	}
	t := r.Target
	if c.FailRate > 0 && (t.Injected5xx == 0 || t.Injected429 == 0 || t.Injected4xx == 0) {
		fail("injected failures missing: %d 5xx, %d 429, %d 4xx", t.Injected5xx, t.Injected429, t.Injected4xx)
	}
	if c.TimeoutRate > 0 && t.TimeoutsHandled+t.TimeoutsStalled == 0 {
		fail("no call timed out")
	}
	if t.Bursts == 0 {
		fail("no throttle burst")
	}
	if c.RollbackRate > 0 && r.Producer.RolledBackTx == 0 {
		fail("no producer transaction was rolled back")
	}
	return errors.Join(errs...)
}

// WriteText prints the figures for a terminal.
func (r *Report) WriteText(w io.Writer) {
	c := r.Config
	t, f, p := r.Target, r.Fleet, r.Producer
	pct := func(a, b int64) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f%%", 100*float64(a)/float64(b))
	}
	fmt.Fprintf(w, "\n== outbox soak: %d messages, %d dispatchers, %s wall (produce %s, drain %s) ==\n",
		c.Messages, c.Dispatchers, r.Wall.Round(time.Second), r.ProduceDuration.Round(time.Second), r.DrainDuration.Round(time.Second))
	fmt.Fprintf(w, "machine: %d CPUs (%s), %d GiB, %s, %s, PostgreSQL %s (autovacuum %s)\n\n", r.Machine.CPUs, r.Machine.CPUModel, r.Machine.MemoryGiB, r.Machine.OS, r.Machine.Go, r.Postgres, r.Autovacuum)

	fmt.Fprintf(w, "faults injected\n")
	fmt.Fprintf(w, "  dispatch processes SIGKILLed        %8d  (%d with rows leased; %d overran and were killed, %d crashed)\n", f.Kills, f.KillsMidBatch, f.Overruns, f.Crashes)
	for i, rs := range r.Restarts {
		fmt.Fprintf(w, "  PostgreSQL restart %d, -m %-9s     %8s  until it accepted connections again (%d rows leased)\n", i+1, rs.Mode, rs.Downtime.Round(time.Millisecond), rs.Leased)
	}
	fmt.Fprintf(w, "  read-only turns (25006)             %8d  (%s each; %d rows leased at them)\n", r.ReadOnlyTurns, c.ReadOnlyFor, r.LeasedAtReadOnly)
	fmt.Fprintf(w, "  lease takeovers (SIGSTOP/SIGCONT)   %8d  (%d rows leased when stopped, %d taken over by others)\n", f.Takeovers, f.LeasedAtTakeovers, f.TakenOver)
	for _, a := range f.ResumedAnswers {
		fmt.Fprintf(w, "    resumed dispatcher answered       %.160s\n", a)
	}
	if s := r.Stuck; s != nil {
		fmt.Fprintf(w, "  stuck key %-22s    %8s  (%d calls refused; %d other messages first delivered meanwhile)\n", s.Key, s.Duration.Round(time.Millisecond), t.StuckRefused, r.StuckOthersDelivered)
	}
	if c.Pooler != "" {
		fmt.Fprintf(w, "  connection pooler                   %8s  (transaction mode, between the functions and PostgreSQL)\n", c.Pooler)
	}
	o := r.Operator
	fmt.Fprintf(w, "operator (outboxctl, %d commands, %d retried)\n", o.Commands, o.CommandRetries)
	fmt.Fprintf(w, "  topic pauses, then resumes          %8d  (%d messages held, %d in flight at the pause)\n", o.Pauses, o.PausedHeld, o.PausedInFlight)
	fmt.Fprintf(w, "  dead letters replayed               %8d  (%d commands; %d parked keys released)\n", o.Replayed, o.ReplayCommands, o.ParkedReleased)
	fmt.Fprintf(w, "  target calls                        %8d\n", t.Calls)
	fmt.Fprintf(w, "    injected 5xx                      %8d  (%s)\n", t.Injected5xx, pct(t.Injected5xx, t.Calls))
	fmt.Fprintf(w, "    injected 429 + Retry-After        %8d  (%s)\n", t.Injected429, pct(t.Injected429, t.Calls))
	fmt.Fprintf(w, "    injected terminal 4xx             %8d  (%s)\n", t.Injected4xx, pct(t.Injected4xx, t.Calls))
	fmt.Fprintf(w, "    timed out, processed late         %8d  (%s)\n", t.TimeoutsHandled, pct(t.TimeoutsHandled, t.Calls))
	fmt.Fprintf(w, "    timed out, never processed        %8d  (%s)\n", t.TimeoutsStalled, pct(t.TimeoutsStalled, t.Calls))
	fmt.Fprintf(w, "    throttle bursts / calls throttled %8d / %d\n", t.Bursts, t.BurstThrottled)
	fmt.Fprintf(w, "  producer transactions               %8d\n", p.Transactions)
	fmt.Fprintf(w, "    rolled back on purpose            %8d  (%d messages)\n", p.RolledBackTx, p.RolledBack)
	fmt.Fprintf(w, "    failed before commit              %8d\n", p.FailedBeforeCommit)
	fmt.Fprintf(w, "    commit failed, found committed    %8d\n", p.CommitErrorCommitted)
	fmt.Fprintf(w, "    commit failed, found not committed%8d\n", p.CommitErrorLost)
	fmt.Fprintf(w, "    dedupe-key re-enqueues            %8d  (%d wrote a message)\n", p.ReEnqueued, p.ReEnqueueInserted)
	fmt.Fprintf(w, "  dispatch invocations                %8d  (%d failed, %d cold-start failures, %d launches)\n", f.Invocations, f.InvocationErrors, f.InitErrors, f.Launches)
	fmt.Fprintf(w, "  reaper invocations                  %8d  (%d requeued, %d failed)\n\n", f.ReaperRuns, f.ReaperRequeued, f.ReaperErrors)

	fmt.Fprintf(w, "results\n")
	fmt.Fprintf(w, "  committed by producers              %8d  (ledger rows %d; %d with an ordering key on %d keys)\n", r.Committed, r.LedgerRows, r.OrderedMessages, r.OrderingKeys)
	fmt.Fprintf(w, "  delivered (distinct)                %8d\n", r.Delivered)
	fmt.Fprintf(w, "  dead-lettered                       %8d  (%s; %d of them also delivered)\n", r.Dead, codes(r.DeadCodes), r.DeliveredAndDead)
	fmt.Fprintf(w, "  LOST                                %8d\n", r.Lost)
	fmt.Fprintf(w, "  duplicates (deliveries beyond first)%8d  on %d messages; bound %d\n", r.Duplicates, r.DuplicatedMessages, r.DuplicateBound)
	fmt.Fprintf(w, "    bound = in flight at faults %d (distinct; leased at kills %d, at restarts %d, at read-only turns %d, at takeovers %d, orphaned %d)\n",
		r.InFlightAtFaults, r.LeasedAtKills, r.LeasedAtRestarts, r.LeasedAtReadOnly, r.LeasedAtTakeover, r.Orphaned)
	fmt.Fprintf(w, "            + unanswered calls %d + stale completions %d\n", r.UnansweredCalls, r.StaleCompletions)
	fmt.Fprintf(w, "    unexplained duplicates            %8d\n", r.UnexplainedDuplicates)
	fmt.Fprintf(w, "  paused messages delivered in pause  %8d  (calls that reached the target between a pause and its resume, in-flight excepted)\n", o.PauseViolations)
	if r.Stuck != nil {
		fmt.Fprintf(w, "  stuck key's messages delivered      %8d  of %d\n", r.StuckKeyDelivered, r.StuckKeyMessages)
	}
	fmt.Fprintf(w, "  per-key order violations            %8d  (late duplicates %d, sequence gaps %d)\n", r.OrderViolations, r.LateDuplicates, r.SequenceGaps)
	fmt.Fprintf(w, "  rolled-back messages delivered      %8d  (found in the outbox tables: %d)\n", r.RolledBackDelivered, r.RolledBackInDatabase)
	fmt.Fprintf(w, "  stale completions rejected          %8d  (lease_lost)\n", r.StaleCompletions)
	fmt.Fprintf(w, "  leases expired and requeued         %8d  (ZOMBIE_REQUEUE attempts)\n", r.ZombieRequeues)
	fmt.Fprintf(w, "  attempts archived                   %s\n", codes(r.AttemptStates))
	fmt.Fprintf(w, "  latency, commit to first delivery   %s (without an ordering key)\n", r.Latency)
	fmt.Fprintf(w, "                                      %s (with one)\n", r.LatencyOrdered)
	if r.ProduceDuration > 0 {
		fmt.Fprintf(w, "  throughput                          %8.0f messages/s (committed over the production phase)\n", float64(r.Committed)/r.ProduceDuration.Seconds())
	}
	if err := r.Check(); err != nil {
		fmt.Fprintf(w, "\nFAILED:\n  %s\n", strings.ReplaceAll(err.Error(), "\n", "\n  "))
	} else {
		fmt.Fprintf(w, "\nPASSED: nothing lost, duplicates within the bound, order kept per key, nothing rolled back delivered\n")
	}
}

func codes(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		name := k
		if name == "" {
			name = "(none)"
		}
		parts = append(parts, fmt.Sprintf("%s %d", name, m[k]))
	}
	return strings.Join(parts, ", ")
}

func splitLines(s string) []string { return strings.Split(s, "\n") }

func cut(line, sep string) (string, string, bool) {
	k, v, ok := strings.Cut(line, sep)
	return strings.TrimSpace(k), strings.TrimSpace(v), ok
}
