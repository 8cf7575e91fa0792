// Package statemachine is a concurrency invariant harness for the outbox's
// SQL functions, the state machine every producer and dispatcher calls.
//
// A run plays a seeded, randomized schedule against a real PostgreSQL
// database, each actor on its own session and logged in as the role it
// plays (outbox_producer, outbox_dispatcher, outbox_operator), so that the
// privileges are part of what is tried:
//
//   - claimers call outbox.claim_batch with random batch sizes, runs of
//     several messages of a key, short leases (1-3 s) and namespace
//     filters; they also sweep expired leases (outbox.repair_expired_leases);
//   - completers call outbox.complete_batch with DISPATCHED, RETRYABLE,
//     FAILED and RELEASED outcomes, a run in part or whole, on time, late
//     (after the lease expired), again (stale), or under the wrong worker;
//   - producers enqueue across namespaces, topics and ordering keys, in
//     autocommit and in transactions left open while others act, then
//     committed or rolled back;
//   - an operator pauses and resumes namespaces and topics, replays dead
//     letters, discards messages, grants and revokes producers' namespaces;
//   - a lock injector (an unrelated session) takes FOR UPDATE, FOR NO KEY
//     UPDATE or FOR KEY SHARE locks on pending rows (mostly leased ones)
//     or on outbox.keys rows, and holds them across other steps, sometimes
//     until the leases they hold up have expired;
//   - and the schedule waits for leases to expire, so that claims take
//     them over.
//
// One step at a time: the scheduler sends a step, then waits until every
// actor is idle or waiting on a lock (pg_stat_activity), and then checks
// every invariant against the database and against what the answers said:
//
//  1. no outcome is recorded for a row by a worker whose lease was not live
//     when it wrote (each attempt ends at most once; an outcome's attempt
//     is the one its worker's claim returned; no written status for a
//     completion sent after the lease expired, or that waited on an
//     injected lock released after it expired, or sent after another
//     claim had taken the row);
//  2. never two live leases covering one key (in outbox.pending, a head's
//     lease covering its run up to run_through; and between the claims'
//     answers);
//  3. no claim returns a message of a namespace or topic paused before the
//     claim was sent and not resumed;
//  4. per key, DISPATCHED in sequence order, but for a message replayed
//     after a later one of its key was dispatched (skip, then replay);
//  5. nothing lost: every committed message is in exactly one of pending,
//     dead, or the archive as DISPATCHED or DISCARDED, and nothing else is
//     there; a producer login is refused every namespace it was not
//     granted once it was granted any (its grants all revoked included);
//  6. the calls the contract says succeed do (no deadlock among them).
//
// Every failure names the seed. A seed makes the same choices from the same
// answers; leases run on the database's clock, so a replay follows the
// failing schedule closely, though not always step for step. Run is the
// library; the package's test runs a few seconds of it in `make test`,
// and shared/testkit/statemachine/cmd/statemachine (make statemachine)
// runs it for minutes, on the host's server and on a throwaway cluster with
// autovacuum on.
package statemachine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Config is one run.
type Config struct {
	// AdminURL connects as a superuser to a database with the outbox
	// migrations applied. The run creates its login roles there and drops
	// them at the end; the database keeps what the run wrote.
	AdminURL string
	// Seed chooses the schedule.
	Seed int64
	// Steps and Duration bound the schedule: it ends at whichever comes
	// first (0: no bound from it; at least one must be set).
	Steps    int
	Duration time.Duration
	// Actors of each kind (defaults 3, 3, 3).
	Claimers, Completers, Producers int
	// MaxLeaseSeconds is the longest lease a claim takes (default 3; at
	// least 1).
	MaxLeaseSeconds int
	// Prepare, when set, runs on a superuser session before anything
	// else: to swap a deliberately broken function in, for example.
	Prepare func(ctx context.Context, admin *pgx.Conn) error
	// KeepGoing continues the schedule after a step that broke an
	// invariant (by default the run stops there).
	KeepGoing bool
	// StopWhen, when set, ends the schedule after the step that broke an
	// invariant it returns true for (and only then, as with KeepGoing):
	// for a test that looks for one kind of violation.
	StopWhen func(Violation) bool
	// Weights multiplies the weight of the steps it names (by the names
	// Report.Actions uses: "claim", "complete late", "pause", ...), to aim
	// a schedule at one part of the state machine.
	Weights map[string]float64
	// Log receives a line per step when set.
	Log io.Writer
	// Trace keeps the whole schedule in the report, not only its end.
	Trace bool
}

// ErrConfig is a configuration Run refuses.
var ErrConfig = errors.New("statemachine: invalid configuration")

// The world the schedule plays in: keys span topics, and a key of one
// namespace is not the same key in another.
var (
	namespaces = []string{"shop", "payments", "reporting"}
	topics     = []string{"orders.A", "refunds.B", "invoices.C"}
	keys       = []string{"acct-1", "acct-2", "acct-3", "acct-4", "acct-5"}
)

// scheduleTail is how many steps of the schedule a report keeps.
const scheduleTail = 40

// stuckAfter ends a run whose actors neither finish nor wait on a lock:
// it is a ceiling for a hung server, not a measure of anything.
const stuckAfter = 5 * time.Minute

// Run plays one schedule and reports what it found. The error is for a run
// that could not be carried out (no server, a role that could not be
// made); broken invariants are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.AdminURL == "" || (cfg.Steps <= 0 && cfg.Duration <= 0) {
		return nil, fmt.Errorf("%w: AdminURL and Steps or Duration are required", ErrConfig)
	}
	for _, n := range []*int{&cfg.Claimers, &cfg.Completers, &cfg.Producers} {
		if *n <= 0 {
			*n = 3
		}
	}
	if cfg.MaxLeaseSeconds <= 0 {
		cfg.MaxLeaseSeconds = 3
	}

	admin, err := pgx.Connect(ctx, cfg.AdminURL)
	if err != nil {
		return nil, fmt.Errorf("statemachine: connect: %w", err)
	}
	defer admin.Close(context.Background())
	if cfg.Prepare != nil {
		if err := cfg.Prepare(ctx, admin); err != nil {
			return nil, fmt.Errorf("statemachine: prepare: %w", err)
		}
	}
	var server string
	if err := admin.QueryRow(ctx, `SELECT 'PostgreSQL ' || current_setting('server_version') || ', autovacuum ' || current_setting('autovacuum')`).Scan(&server); err != nil {
		return nil, fmt.Errorf("statemachine: %w", err)
	}

	s := &sched{
		cfg:      cfg,
		rng:      mrand.New(mrand.NewPCG(uint64(cfg.Seed), 0x5eed)),
		results:  make(chan result, 64),
		msgs:     map[uuid.UUID]*message{},
		claims:   map[string]*claim{},
		tokens:   map[uuid.UUID]*claim{},
		pauses:   map[string]*pause{},
		grants:   map[string]*grants{},
		dedupe:   map[string][]string{},
		replays:  map[uuid.UUID]int64{},
		reported: map[string]bool{},
		report:   &Report{Seed: cfg.Seed, Server: server, Actions: map[string]int{}},
		checker:  admin,
		adminURL: cfg.AdminURL,
	}
	logins, dropLogins, err := createLogins(ctx, admin, cfg)
	if err != nil {
		return nil, err
	}
	defer dropLogins()
	if err := s.connect(ctx, logins); err != nil {
		s.close()
		return nil, err
	}
	defer s.close()

	start := time.Now()
	err = s.play(ctx, start)
	s.report.Elapsed = time.Since(start)
	s.report.Committed = s.committed()
	if err != nil {
		return s.report, err
	}
	return s.report, nil
}

// logins are the connection strings of the roles the actors log in as.
type logins struct {
	dispatcher, operator string
	producers            []string // one login each
	producerRoles        []string
}

// createLogins makes a login for each role an actor plays (one per
// producer, since namespace grants are per login), named with a random
// suffix so that concurrent runs on one server never share one, and
// returns a function that drops them.
func createLogins(ctx context.Context, admin *pgx.Conn, cfg Config) (logins, func(), error) {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		return logins{}, nil, err
	}
	suffix := hex.EncodeToString(b[:])
	var made []string
	drop := func() {
		ctx := context.Background()
		for _, role := range made {
			_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
			_, _ = admin.Exec(ctx, "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
			_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
		}
	}
	login := func(name, granted string) (string, error) {
		role := "statemachine_" + suffix + "_" + name
		if _, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN"); err != nil {
			return "", fmt.Errorf("statemachine: create login %s: %w", role, err)
		}
		made = append(made, role)
		if _, err := admin.Exec(ctx, "GRANT "+pgx.Identifier{granted}.Sanitize()+" TO "+pgx.Identifier{role}.Sanitize()); err != nil {
			return "", fmt.Errorf("statemachine: grant %s to %s: %w", granted, role, err)
		}
		u, err := url.Parse(cfg.AdminURL)
		if err != nil {
			return "", fmt.Errorf("statemachine: AdminURL must be a URL: %w", err)
		}
		u.User = url.User(role)
		return u.String(), nil
	}
	var l logins
	var err error
	if l.dispatcher, err = login("dispatcher", "outbox_dispatcher"); err != nil {
		drop()
		return l, nil, err
	}
	if l.operator, err = login("operator", "outbox_operator"); err != nil {
		drop()
		return l, nil, err
	}
	for i := range cfg.Producers {
		u, err := login(fmt.Sprintf("producer%d", i+1), "outbox_producer")
		if err != nil {
			drop()
			return l, nil, err
		}
		l.producers = append(l.producers, u)
		l.producerRoles = append(l.producerRoles, made[len(made)-1])
	}
	return l, drop, nil
}

// actor is one session and what it is doing.
type actor struct {
	name  string
	kind  string // claimer, completer, producer, operator, injector
	conn  *pgx.Conn
	pid   uint32
	busy  bool
	doing string
	// tx is a producer's or the injector's open transaction; only the
	// actor's own steps touch it.
	tx pgx.Tx
	// role is a producer's login role, for grants.
	role string
	// The model's view of an open transaction: a producer's messages, the
	// injector's locks.
	txMsgs []*message
	txNS   string
	txKey  string
	inTx   bool
	locks  *injected
}

type result struct {
	a     *actor
	apply func(recvAt int64)
}

// sched is the scheduler, the model and the checker, all on one
// goroutine; only the actors' calls run on others.
type sched struct {
	cfg      Config
	rng      *mrand.Rand
	results  chan result
	adminURL string
	checker  *pgx.Conn // the administrative session: checks, clock polls

	claimers, completers, producers []*actor
	operator, injector              *actor
	actors                          []*actor

	tick   int64
	step   int
	dbNow  time.Time // the database's clock at the last check
	report *Report
	tail   []string
	halted bool // a violation was found and the run stops

	msgs        map[uuid.UUID]*message
	claims      map[string]*claim // by worker
	tokens      map[uuid.UUID]*claim
	claimList   []*claim
	completions []*completion
	locks       []*injected
	pauses      map[string]*pause // in force, by ns/topic
	allPauses   []*pause
	grants      map[string]*grants // by producer role
	dedupe      map[string][]string
	replays     map[uuid.UUID]int64 // when a replay that returned the message answered (the last)
	reported    map[string]bool     // violations of the database's state already reported
	nClaim      int
	nCompletion int

	// The last check's view of the database, for choosing what to replay,
	// discard and lock.
	seenPending []uuid.UUID
	seenDead    []uuid.UUID
	seenKeys    [][2]string
}

func (s *sched) connect(ctx context.Context, l logins) error {
	add := func(name, kind, connString string) (*actor, error) {
		conn, err := pgx.Connect(ctx, connString)
		if err != nil {
			return nil, fmt.Errorf("statemachine: connect %s: %w", name, err)
		}
		a := &actor{name: name, kind: kind, conn: conn, pid: conn.PgConn().PID()}
		s.actors = append(s.actors, a)
		return a, nil
	}
	for i := range s.cfg.Claimers {
		a, err := add(fmt.Sprintf("claimer%d", i+1), "claimer", l.dispatcher)
		if err != nil {
			return err
		}
		s.claimers = append(s.claimers, a)
	}
	for i := range s.cfg.Completers {
		a, err := add(fmt.Sprintf("completer%d", i+1), "completer", l.dispatcher)
		if err != nil {
			return err
		}
		s.completers = append(s.completers, a)
	}
	for i, u := range l.producers {
		a, err := add(fmt.Sprintf("producer%d", i+1), "producer", u)
		if err != nil {
			return err
		}
		a.role = l.producerRoles[i]
		s.grants[a.role] = &grants{ns: map[string]bool{}}
		s.producers = append(s.producers, a)
	}
	var err error
	if s.operator, err = add("operator", "operator", l.operator); err != nil {
		return err
	}
	// The unrelated session that injects locks: it may lock the queue's
	// rows, which no outbox role may.
	if s.injector, err = add("injector", "injector", s.adminURL); err != nil {
		return err
	}
	return nil
}

func (s *sched) close() {
	busy := 0
	for _, a := range s.actors {
		if a.busy {
			// A call still running (the run failed): cancel it on the
			// server so that its answer comes.
			_, _ = s.checker.Exec(context.Background(), `SELECT pg_cancel_backend($1)`, a.pid)
			busy++
		}
	}
	for range busy {
		<-s.results
	}
	for _, a := range s.actors {
		a.conn.Close(context.Background())
	}
}

func (s *sched) logf(format string, args ...any) {
	line := fmt.Sprintf("step %d: ", s.step) + fmt.Sprintf(format, args...)
	if s.cfg.Trace {
		s.report.Schedule = append(s.report.Schedule, line)
	} else {
		s.tail = append(s.tail, line)
		if len(s.tail) > scheduleTail {
			s.tail = s.tail[1:]
		}
	}
	if s.cfg.Log != nil {
		fmt.Fprintln(s.cfg.Log, line)
	}
}

// start sends a step to an actor: call runs on its own goroutine and
// returns what to record when its answer is taken in.
func (s *sched) start(ctx context.Context, a *actor, doing string, call func(ctx context.Context) func(recvAt int64)) {
	a.busy = true
	a.doing = doing
	s.logf("%s %s", a.name, doing)
	go func() {
		apply := call(ctx)
		s.results <- result{a: a, apply: apply}
	}()
}

func (s *sched) receive(r result) {
	s.tick++
	r.a.busy = false
	r.a.doing = ""
	if r.apply != nil {
		r.apply(s.tick)
	}
}

// settle waits until every actor is idle or waiting on a lock (or on the
// sleep between the rounds of outbox.resume), taking in the answers as
// they come.
func (s *sched) settle(ctx context.Context) error {
	deadline := time.Now().Add(stuckAfter)
	for {
		for drained := false; !drained; {
			select {
			case r := <-s.results:
				s.receive(r)
			default:
				drained = true
			}
		}
		var busy []uint32
		var names []string
		for _, a := range s.actors {
			if a.busy {
				busy = append(busy, a.pid)
				names = append(names, a.name+" ("+a.doing+")")
			}
		}
		if len(busy) == 0 {
			return nil
		}
		var waiting int
		if err := s.checker.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE pid = ANY ($1) AND (wait_event_type = 'Lock' OR wait_event = 'PgSleep')`, busy).Scan(&waiting); err != nil {
			return fmt.Errorf("statemachine: watch the sessions: %w", err)
		}
		if waiting == len(busy) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("statemachine: seed %d step %d: %s neither finished nor waited on a lock for %s",
				s.cfg.Seed, s.step, strings.Join(names, ", "), stuckAfter)
		}
		select {
		case r := <-s.results:
			s.receive(r)
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// play runs the schedule, then winds it down: the injected locks released,
// the producers' transactions committed, every call answered, and a last
// check.
func (s *sched) play(ctx context.Context, start time.Time) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	for !s.halted {
		if s.cfg.Steps > 0 && s.step >= s.cfg.Steps {
			break
		}
		if s.cfg.Duration > 0 && time.Since(start) >= s.cfg.Duration {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		s.step++
		if err := s.next(ctx); err != nil {
			return err
		}
		if err := s.settle(ctx); err != nil {
			return err
		}
		if err := s.check(ctx); err != nil {
			return err
		}
	}
	s.report.Steps = s.step
	if !s.cfg.Trace {
		s.report.Schedule = s.tail
	}
	// Wind down, checking after each step as before.
	s.step++
	for s.injector.busy {
		if err := s.await(ctx); err != nil {
			return err
		}
	}
	if s.injector.inTx {
		s.unlock(ctx, s.injector, false)
		if err := s.settle(ctx); err != nil {
			return err
		}
	}
	// Every open transaction committed; a producer waiting on another's
	// transaction (one key) goes on once that one commits.
	for {
		waiting := false
		for _, p := range s.producers {
			if !p.busy && p.inTx {
				s.endTx(ctx, p, true)
			}
		}
		if err := s.settle(ctx); err != nil {
			return err
		}
		for _, p := range s.producers {
			waiting = waiting || p.busy || p.inTx
		}
		if !waiting {
			break
		}
		if !s.anyIdleInTx() {
			if err := s.await(ctx); err != nil {
				return err
			}
		}
	}
	for s.anyBusy() {
		if err := s.await(ctx); err != nil {
			return err
		}
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	if !s.cfg.Trace {
		s.report.Schedule = s.tail
	}
	return nil
}

// await takes in the next answer.
func (s *sched) await(ctx context.Context) error {
	select {
	case r := <-s.results:
		s.receive(r)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(stuckAfter):
		return fmt.Errorf("statemachine: seed %d: no answer for %s while winding down", s.cfg.Seed, stuckAfter)
	}
}

func (s *sched) anyBusy() bool {
	for _, a := range s.actors {
		if a.busy {
			return true
		}
	}
	return false
}

func (s *sched) anyIdleInTx() bool {
	for _, p := range s.producers {
		if !p.busy && p.inTx {
			return true
		}
	}
	return false
}

func (s *sched) committed() int {
	n := 0
	for _, m := range s.msgs {
		if m.state == msgCommitted {
			n++
		}
	}
	return n
}

// violate records a broken invariant found at the current step.
func (s *sched) violate(inv int, format string, args ...any) {
	v := Violation{Invariant: inv, Step: s.step, Seed: s.cfg.Seed, Message: fmt.Sprintf(format, args...)}
	s.report.Violations = append(s.report.Violations, v)
	s.logf("VIOLATION %s", v)
	if s.cfg.StopWhen != nil {
		s.halted = s.halted || s.cfg.StopWhen(v)
	} else if !s.cfg.KeepGoing {
		s.halted = true
	}
}
