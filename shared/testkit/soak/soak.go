package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgbouncer"
)

// Config sizes a soak run. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Messages is how many messages the producers commit.
	Messages int
	// Dispatchers is the number of dispatch processes.
	Dispatchers int
	// Producers is the number of concurrent producer transactions.
	Producers int
	// MaxTxMessages bounds the messages of one business transaction.
	MaxTxMessages int
	// Kills is how many times a dispatch process is SIGKILLed.
	Kills int
	// PGRestarts is how many times PostgreSQL restarts (fast, then
	// immediate, alternately).
	PGRestarts int
	// FailRate and TimeoutRate are the target's injected failures and
	// timeouts, as shares of its calls.
	FailRate, TimeoutRate float64
	// Bursts is how many times every call is answered 429 for
	// BurstLength, spread over the production phase.
	Bursts      int
	BurstLength time.Duration
	// RouteTimeout is the webhook route's timeout.
	RouteTimeout time.Duration
	// MaxAttempts, BaseDelay and MaxDelay are the route's retry policy.
	MaxAttempts         int
	BaseDelay, MaxDelay time.Duration
	// RollbackRate is the share of business transactions rolled back on
	// purpose.
	RollbackRate float64
	// OrderedShare and DedupeShare are the shares of messages with an
	// ordering key and with a dedupe key; Keys is the number of ordering
	// keys (accounts).
	OrderedShare, DedupeShare float64
	Keys                      int
	// BatchSize is the dispatchers' claim size; Budget each invocation's
	// time; Lease the claim's lease; Tick the pause between invocations
	// after one that drained the queue (a compressed schedule).
	BatchSize int
	Budget    time.Duration
	Lease     time.Duration
	Tick      time.Duration
	// ReaperEvery is the reaper's schedule.
	ReaperEvery time.Duration
	// MaxBacklog pauses the producers while more messages than this are
	// committed but not yet delivered or dead, so that they keep producing
	// for the whole run instead of front-loading it.
	MaxBacklog int
	// Timeout bounds the whole run; DrainTimeout the wait for the queue to
	// empty once the producers are done.
	Timeout, DrainTimeout time.Duration
	// Pauses is how many times the operator pauses the topic usage_record
	// (outboxctl pause) for PauseFor, then resumes it.
	Pauses   int
	PauseFor time.Duration
	// ReplayEvery is how often the operator replays dead letters
	// (outboxctl dead list, outboxctl replay) while the producers run:
	// those without an ordering key, and the parked heads of the transfer
	// topic's route (on_dead: park), which releases their keys.
	ReplayEvery time.Duration
	// StuckFor is how long the target refuses every call for one ordering
	// key (a stuck key) while the others flow; at least until it has
	// refused one. Zero: no stuck key.
	StuckFor time.Duration
	// Takeovers is how many times a dispatcher is stopped (SIGSTOP) past
	// its lease holding rows, and resumed.
	Takeovers int
	// ReadOnlyTurns is how many times the server turns read-only for
	// ReadOnlyFor (default_transaction_read_only, as after a failover onto
	// a replica), then writable again.
	ReadOnlyTurns int
	ReadOnlyFor   time.Duration
	// Pooler "pgbouncer" puts PgBouncer in transaction mode between the
	// functions and PostgreSQL, and sets OUTBOX_DB_POOLER=transaction.
	Pooler string
	// Log receives progress lines (nil: discarded).
	Log io.Writer

	routes string
}

// DefaultConfig is the full soak: a million messages, 24 kills, two
// restarts. Its time limit is a ceiling for a run that cannot finish: the
// million took 11 min on a shared 2-core machine (docs/RELIABILITY.md).
func DefaultConfig() Config {
	return Config{
		Messages: 1_000_000, Dispatchers: 8, Producers: 4, MaxTxMessages: 20,
		Kills: 24, PGRestarts: 2,
		FailRate: 0.10, TimeoutRate: 0.01, Bursts: 30, BurstLength: 1500 * time.Millisecond,
		RouteTimeout: 750 * time.Millisecond, MaxAttempts: 12, BaseDelay: 200 * time.Millisecond, MaxDelay: 2 * time.Second,
		RollbackRate: 0.05, OrderedShare: 0.3, DedupeShare: 0.5, Keys: 2000,
		BatchSize: 500, Budget: 6 * time.Second, Lease: 10 * time.Second, Tick: 200 * time.Millisecond,
		ReaperEvery: 2 * time.Second, MaxBacklog: 10_000,
		Timeout: 20 * time.Minute, DrainTimeout: 3 * time.Minute,
		Pauses: 3, PauseFor: 10 * time.Second, ReplayEvery: 10 * time.Second, StuckFor: 12 * time.Second,
		Takeovers: 3, ReadOnlyTurns: 3, ReadOnlyFor: 3 * time.Second,
	}
}

// QuickConfig is the variant the test suite runs: 20,000 messages, fewer
// kills, the same two restarts.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Messages = 20_000
	c.Kills = 5
	c.Bursts, c.BurstLength = 4, time.Second
	c.Keys = 400
	c.MaxBacklog = 3_000
	c.Pauses, c.PauseFor = 1, 3*time.Second
	c.ReplayEvery, c.StuckFor = 3*time.Second, 5*time.Second
	c.Takeovers, c.ReadOnlyTurns, c.ReadOnlyFor = 1, 1, 2*time.Second
	// The drain waits as long as the full soak's: an ordered message that
	// meets a kill, a restart and the target's refusals in a row waits for
	// each (a lease of the invocation's time left, the route's backoff), and
	// quick runs measured such a message's commit-to-delivery at up to
	// 1m47s, too near a 2-minute drain on a loaded machine. A drained queue
	// ends the wait at once, so a passing run takes no longer.
	c.Timeout, c.DrainTimeout = 5*time.Minute, 3*time.Minute
	return c
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setInt(&c.Messages, d.Messages)
	setInt(&c.Dispatchers, d.Dispatchers)
	setInt(&c.Producers, d.Producers)
	setInt(&c.MaxTxMessages, d.MaxTxMessages)
	setInt(&c.MaxAttempts, d.MaxAttempts)
	setInt(&c.Keys, d.Keys)
	setInt(&c.BatchSize, d.BatchSize)
	setInt(&c.MaxBacklog, d.MaxBacklog)
	setInt(&c.Bursts, d.Bursts)
	setDur(&c.BurstLength, d.BurstLength)
	setDur(&c.RouteTimeout, d.RouteTimeout)
	setDur(&c.BaseDelay, d.BaseDelay)
	setDur(&c.MaxDelay, d.MaxDelay)
	setDur(&c.Budget, d.Budget)
	setDur(&c.Lease, d.Lease)
	setDur(&c.Tick, d.Tick)
	setDur(&c.ReaperEvery, d.ReaperEvery)
	setDur(&c.Timeout, d.Timeout)
	setDur(&c.DrainTimeout, d.DrainTimeout)
	setDur(&c.PauseFor, d.PauseFor)
	setDur(&c.ReplayEvery, d.ReplayEvery)
	setDur(&c.ReadOnlyFor, d.ReadOnlyFor)
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

// secret is the webhook signing secret shared by the target and the
// dispatchers (through SOAK_WEBHOOK_SECRET).
const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// Run runs one soak and returns its report. The error is for a run that
// could not be carried out (the cluster would not start, the queue never
// drained); the report's Check says whether the guarantees held.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	started := time.Now()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	logf := func(format string, args ...any) {
		fmt.Fprintf(cfg.Log, "%s soak: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	rep := &Report{Config: cfg, Machine: machine()}

	// 1. The functions, built as they are deployed.
	binaries := map[string]string{}
	for _, name := range []string{"dispatch", "reaper", "metrics"} {
		path, err := lambdatest.BuildBinary(name)
		if err != nil {
			return nil, err
		}
		binaries[name] = path
	}
	// The operator's tool, built once, run as a process per command.
	outboxctl, err := lambdatest.BuildPackage("./cmd/outboxctl")
	if err != nil {
		return nil, err
	}
	events, err := loadEvents()
	if err != nil {
		return nil, err
	}

	// 2. A cluster of our own, migrated, with login roles that hold only
	// the outbox roles.
	bin, err := FindPostgres()
	if err != nil {
		return nil, err
	}
	cluster, err := StartCluster(ctx, bin)
	if err != nil {
		return nil, err
	}
	defer cluster.Stop()
	logf("PostgreSQL (%s) on 127.0.0.1:%d, data in a temporary directory", bin, cluster.Port)
	if err := prepareDatabase(ctx, cluster); err != nil {
		return nil, err
	}
	admin, err := openPool(ctx, cluster.URL("postgres", "soak"), 4)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	producerPool, err := openPool(ctx, cluster.URL("soak_producer", "soak"), int32(cfg.Producers+2))
	if err != nil {
		return nil, err
	}
	defer producerPool.Close()

	// 3. The target.
	key, err := webhook.ParseSecret(secret)
	if err != nil {
		return nil, err
	}
	target, err := StartTarget(key, TargetFaults{FailRate: cfg.FailRate, TimeoutRate: cfg.TimeoutRate,
		RouteTimeout: cfg.RouteTimeout, RetryAfter: time.Second})
	if err != nil {
		return nil, err
	}
	targetClosed := false
	defer func() {
		if !targetClosed {
			target.Close()
		}
	}()
	// transfer is a payment stream: a dead head parks its key until the
	// operator replays it. The rest skips a dead message.
	route := func(name, topic, onDead string) string {
		return fmt.Sprintf(`{"name":%q,"match":{"namespace":"*","topic":%q},"on_dead":%q,
		"target":{"type":"http","url":%q,"signing_secret_env":"SOAK_WEBHOOK_SECRET","timeout":%q},
		"retry":{"max_attempts":%d,"base_delay":%q,"max_delay":%q}}`,
			name, topic, onDead, target.URL, cfg.RouteTimeout.String(), cfg.MaxAttempts, cfg.BaseDelay.String(), cfg.MaxDelay.String())
	}
	cfg.routes = `{"routes":[` + route("soak-transfer", "transfer", "park") + "," + route("soak-webhook", "*", "skip") + `]}`
	rep.Config = cfg

	// 4. The functions (through PgBouncer when asked), and the producers.
	dispatcherURL := cluster.URL("soak_dispatcher", "soak")
	var poolerEnv []string
	switch cfg.Pooler {
	case "", "none":
	case "pgbouncer":
		b, err := pgbouncer.StartFor(cluster.URL("postgres", "postgres"), "soak_dispatcher")
		if err != nil {
			return nil, fmt.Errorf("soak: %w", err)
		}
		defer b.Stop()
		if dispatcherURL, err = b.Through(dispatcherURL); err != nil {
			return nil, err
		}
		poolerEnv = []string{"OUTBOX_DB_POOLER=transaction"}
		logf("the functions connect through PgBouncer (transaction mode) at %s", b.Addr)
	default:
		return nil, fmt.Errorf("soak: unknown pooler %q: want pgbouncer or none", cfg.Pooler)
	}
	flt := &fleet{
		cfg: cfg, binaries: binaries, admin: admin, events: events, log: logf,
		inflight: &inflight{ids: map[uuid.UUID]struct{}{}},
		env: append([]string{
			"OUTBOX_DATABASE_URL=" + dispatcherURL,
			"OUTBOX_TRACING=off",
			"OUTBOX_LOG_LEVEL=warn",
			"OUTBOX_DB_CONNECT_TIMEOUT=2s",
			"SOAK_WEBHOOK_SECRET=" + secret,
		}, poolerEnv...),
	}
	op := &operator{bin: outboxctl, url: cluster.URL("postgres", "soak"), log: logf}
	book := newLedgerBook(cfg.Messages)
	// unpaced lets the producers run flat out for a moment before each
	// restart, so that the restart catches transactions in flight, some of
	// them in COMMIT.
	var unpaced atomic.Bool
	prod := &producers{cfg: cfg, pool: producerPool, book: book, log: logf}
	prod.paced = func(ctx context.Context) error {
		for {
			if unpaced.Load() {
				return nil
			}
			backlog := book.committedCount.Load() - target.firstDeliveries.Load() - flt.Counts().Dead
			if backlog < int64(cfg.MaxBacklog) {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(25 * time.Millisecond):
			}
		}
	}
	faults := &faultLog{}
	var stuck atomic.Pointer[StuckWindow]
	var readOnly atomic.Int64
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	flt.start(runCtx)
	defer flt.shutdown()

	logf("%d dispatchers, a reaper and a metrics exporter running; producing %d messages", cfg.Dispatchers, cfg.Messages)
	produceStart := time.Now()
	var wg sync.WaitGroup
	var produceErr error
	produced := make(chan struct{})
	wg.Go(func() {
		defer close(produced)
		produceErr = prod.run(runCtx)
	})

	// 5. The faults, spread over production by progress.
	progress := func() float64 { return float64(book.committedCount.Load()) / float64(cfg.Messages) }
	waitFor := func(frac float64) bool {
		for progress() < frac {
			select {
			case <-runCtx.Done():
				return false
			case <-produced:
				return progress() >= frac
			case <-time.After(20 * time.Millisecond):
			}
		}
		return true
	}
	wg.Go(func() {
		for i := range cfg.Kills {
			if !waitFor((float64(i) + 0.25 + 0.5*rand.Float64()) / float64(cfg.Kills)) {
				return
			}
			flt.kill(runCtx)
		}
	})
	wg.Go(func() {
		for i := range cfg.PGRestarts {
			if !waitFor(float64(i+1) / float64(cfg.PGRestarts+1)) {
				return
			}
			mode := RestartFast
			if i%2 == 1 {
				mode = RestartImmediate
			}
			// Everything leased now is in flight when the server goes away:
			// a completion that cannot reach it leaves its rows leased until
			// the lease expires, and they are delivered again.
			unpaced.Store(true)
			time.Sleep(time.Second)
			before := flt.leased(runCtx, leasedSQL+` WHERE h.lease_token IS NOT NULL`)
			took, err := cluster.Restart(runCtx, mode)
			unpaced.Store(false)
			if err != nil {
				faults.fail(fmt.Errorf("restart %d (%s): %w", i+1, mode, err))
				return
			}
			flt.inflight.add(&flt.inflight.atRestarts, before)
			faults.restart(Restart{Mode: mode, Downtime: took, Leased: len(before)})
			logf("PostgreSQL restarted (-m %s) in %s with %d rows leased", mode, took.Round(time.Millisecond), len(before))
		}
	})
	wg.Go(func() {
		for i := range cfg.Bursts {
			if !waitFor((float64(i) + rand.Float64()) / float64(cfg.Bursts)) {
				return
			}
			target.Burst(cfg.BurstLength)
		}
	})
	// The operator, from its own processes.
	wg.Go(func() {
		for i := range cfg.Pauses {
			if !waitFor((float64(i) + 0.3) / float64(cfg.Pauses)) {
				return
			}
			if err := op.pause(runCtx, flt, "payments", "usage_record", cfg.PauseFor, i+1); err != nil && runCtx.Err() == nil {
				faults.fail(fmt.Errorf("pause %d: %w", i+1, err))
				return
			}
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-runCtx.Done():
				return
			case <-produced:
				return
			case <-time.After(cfg.ReplayEvery):
			}
			if err := op.replayDead(runCtx, true); err != nil && runCtx.Err() == nil {
				faults.fail(fmt.Errorf("replay: %w", err))
				return
			}
		}
	})
	if cfg.StuckFor > 0 {
		wg.Go(func() {
			if !waitFor(0.15) {
				return
			}
			// The key with the most messages waiting, so that its head is
			// called for while it is stuck however the run was paced; a
			// fixed key may have nothing left to send by then.
			key := stuckKey
			_ = admin.QueryRow(runCtx, `SELECT ordering_key FROM outbox.pending
				WHERE ordering_key LIKE 'payments:%' GROUP BY ordering_key ORDER BY count(*) DESC LIMIT 1`).Scan(&key)
			w := StuckWindow{Key: key, Start: time.Now()}
			target.Stick(key)
			logf("the target refuses every call for %s", key)
			// At least StuckFor, and until the key's head has been refused
			// and another message delivered meanwhile, however slow the
			// machine; but no longer than the production (a key with
			// nothing left to send is not stuck, and would hold the drain).
			others := target.firstDeliveries.Load()
			for runCtx.Err() == nil {
				enough := time.Since(w.Start) >= cfg.StuckFor
				seen := target.stuckRefused.Load() > 0 && target.firstDeliveries.Load() > others
				done := false
				select {
				case <-produced:
					done = true
				default:
				}
				if enough && (seen || done) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			target.Unstick()
			w.End = time.Now()
			stuck.Store(&w)
			logf("%s recovers after %s: %d calls refused", key, w.End.Sub(w.Start).Round(time.Millisecond), target.stuckRefused.Load())
		})
	}
	wg.Go(func() {
		for i := range cfg.Takeovers {
			if !waitFor((float64(i) + 0.6) / float64(cfg.Takeovers)) {
				return
			}
			if err := flt.takeover(runCtx); err != nil && runCtx.Err() == nil {
				faults.fail(err)
				return
			}
		}
	})
	wg.Go(func() {
		for i := range cfg.ReadOnlyTurns {
			if !waitFor((float64(i) + 0.5) / float64(cfg.ReadOnlyTurns)) {
				return
			}
			before := flt.leased(runCtx, leasedSQL+` WHERE h.lease_token IS NOT NULL`)
			if err := readOnlyTurn(runCtx, cluster, cfg.ReadOnlyFor); err != nil {
				faults.fail(fmt.Errorf("read-only turn %d: %w", i+1, err))
				return
			}
			flt.inflight.add(&flt.inflight.atReadOnly, before)
			readOnly.Add(1)
			logf("the server was read-only for %s with %d rows leased", cfg.ReadOnlyFor, len(before))
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
				fc, tc := flt.Counts(), target.Counts()
				line := fmt.Sprintf("committed %d/%d, delivered %d (distinct), dead %d; kills %d, restarts %d, bursts %d, invocation errors %d",
					book.committedCount.Load(), cfg.Messages, target.firstDeliveries.Load(), fc.Dead,
					fc.Kills, len(faults.restarts()), tc.Bursts, fc.InvocationErrors)
				if s := flt.lastStats.Load(); s != nil {
					line += fmt.Sprintf("; metrics fn: pending %d, leased %d, expired %d", s.Pending, s.Leased, s.ExpiredLeases)
				}
				logf("%s", line)
			}
		}
	})

	<-produced
	rep.ProduceDuration = time.Since(produceStart)
	if produceErr != nil && ctx.Err() == nil {
		faults.fail(fmt.Errorf("producers: %w", produceErr))
	}
	logf("producers done: %d messages committed in %s", book.committedCount.Load(), rep.ProduceDuration.Round(time.Second))

	// 6. Drain: every committed message delivered or dead, nothing pending.
	drainStart := time.Now()
	drained := false
	// The operator goes on releasing parked keys, from here, so that no
	// replay races the final count.
	lastRelease := time.Now()
	for deadline := time.Now().Add(cfg.DrainTimeout); time.Now().Before(deadline) && ctx.Err() == nil; {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM outbox.pending`).Scan(&n); err == nil && n == 0 {
			drained = true
			break
		}
		if time.Since(lastRelease) > 2*time.Second {
			if err := op.replayDead(ctx, false); err != nil {
				faults.fail(fmt.Errorf("releasing parked keys: %w", err))
			}
			lastRelease = time.Now()
		}
		time.Sleep(250 * time.Millisecond)
	}
	rep.DrainDuration = time.Since(drainStart)
	stopRun()
	wg.Wait()
	flt.shutdown()
	target.Close()
	targetClosed = true
	rep.Wall = time.Since(started)
	logf("queue drained: %v after %s; checking", drained, rep.DrainDuration.Round(time.Second))

	// 7. The accounting.
	checkCtx, cancelCheck := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancelCheck()
	rep.Stuck = stuck.Load()
	rep.ReadOnlyTurns = readOnly.Load()
	if err := rep.account(checkCtx, admin, book, target, flt, faults, op); err != nil {
		return rep, err
	}
	rep.Drained = drained
	if err := faults.err(); err != nil {
		return rep, err
	}
	if !drained {
		return rep, fmt.Errorf("soak: the queue did not drain within %s: %d messages still pending", cfg.DrainTimeout, rep.Pending)
	}
	return rep, nil
}

// stuckKey is the ordering key the target refuses for a while when no key
// has messages waiting as the window opens.
const stuckKey = "payments:acct-0"

// StuckWindow is when the target refused every call for one key.
type StuckWindow struct {
	Key        string        `json:"key"`
	Start, End time.Time     `json:"-"`
	Duration   time.Duration `json:"duration"`
}

// readOnlyTurn makes the server read-only for d, as a failover onto a
// server that is (still) a replica does to a warm function's connections,
// then writable again. Sessions pick the setting up at the reload, and
// their writes fail with SQLSTATE 25006. The turn's own session stays
// writable; the reset is retried should the server restart meanwhile.
func readOnlyTurn(ctx context.Context, c *Cluster, d time.Duration) error {
	set := func(ctx context.Context, stmt string) error {
		conn, err := pgx.Connect(ctx, c.URL("postgres", "postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		for _, s := range []string{`SET default_transaction_read_only = off`, stmt, `SELECT pg_reload_conf()`} {
			if _, err := conn.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	}
	if err := set(ctx, `ALTER SYSTEM SET default_transaction_read_only = on`); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	var err error
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = set(context.WithoutCancel(ctx), `ALTER SYSTEM RESET default_transaction_read_only`); err == nil {
			return nil
		}
	}
	return err
}

// prepareDatabase creates the soak database, migrates it, adds the
// business table and the login roles.
func prepareDatabase(ctx context.Context, c *Cluster) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres", "postgres"))
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `CREATE DATABASE soak`)
	conn.Close(ctx)
	if err != nil {
		return err
	}
	m, err := migrations.Open(c.URL("postgres", "soak"))
	if err != nil {
		return err
	}
	_, err = m.Up(ctx)
	m.Close()
	if err != nil {
		return err
	}
	conn, err = pgx.Connect(ctx, c.URL("postgres", "soak"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, stmt := range []string{
		ledgerSQL,
		// The functions log in as a user granted only outbox_dispatcher; the
		// producers as one granted only outbox_producer and its own table.
		`CREATE ROLE soak_dispatcher LOGIN IN ROLE outbox_dispatcher`,
		`CREATE ROLE soak_producer LOGIN IN ROLE outbox_producer`,
		`GRANT USAGE ON SCHEMA shop TO soak_producer`,
		`GRANT SELECT, INSERT ON shop.ledger TO soak_producer`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("soak: %s: %w", stmt, err)
		}
	}
	return nil
}

// loadEvents reads the schedule events from events/: the Scheduler's {} and
// an EventBridge scheduled-rule envelope, used alternately.
func loadEvents() ([][]byte, error) {
	dir, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return nil, errors.New("soak: run inside the module (no go.mod above the working directory)")
		}
		dir = parent
	}
	var out [][]byte
	for _, name := range []string{"dispatch-schedule.json", "dispatch-scheduled-rule.json"} {
		b, err := os.ReadFile(filepath.Join(dir, "events", name))
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// Restart is one PostgreSQL restart.
type Restart struct {
	Mode     string        `json:"mode"`
	Downtime time.Duration `json:"downtime"`
	// Leased is the rows leased when the restart began: in flight.
	Leased int `json:"leased"`
}

// faultLog records the restarts and any failure of the fault machinery.
type faultLog struct {
	mu   sync.Mutex
	list []Restart
	errs []error
}

func (f *faultLog) restart(r Restart) {
	f.mu.Lock()
	f.list = append(f.list, r)
	f.mu.Unlock()
}

func (f *faultLog) restarts() []Restart {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Restart(nil), f.list...)
}

func (f *faultLog) fail(err error) {
	f.mu.Lock()
	f.errs = append(f.errs, err)
	f.mu.Unlock()
}

func (f *faultLog) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}

// Machine describes where the soak ran.
type Machine struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	MemoryGiB int    `json:"memory_gib"`
	OS        string `json:"os"`
	Go        string `json:"go"`
	Postgres  string `json:"postgres"`
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range splitLines(string(b)) {
			if k, v, ok := cut(line, ":"); ok && k == "model name" {
				m.CPUModel = v
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range splitLines(string(b)) {
			if k, v, ok := cut(line, ":"); ok && k == "MemTotal" {
				var kb int
				fmt.Sscanf(v, "%d", &kb)
				m.MemoryGiB = (kb + 512*1024) / (1024 * 1024)
			}
		}
	}
	return m
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
