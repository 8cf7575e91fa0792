package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/migrations"
	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
	"github.com/outboxkit/dispatcher/shared/handler/reaperfn"
	"github.com/outboxkit/dispatcher/shared/handler/replayfn"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/sink"
)

type demoOptions struct {
	messages  int
	tenants   int
	postgres  string
	database  string
	localDir  string
	drainTime time.Duration
	asJSON    bool
}

func newDemoCommand(g *globalOptions) *cobra.Command {
	opts := demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "The whole data path on this machine in one command (make run)",
		Long: `Run the whole data path locally, with no configuration:

  1. PostgreSQL: the server of OUTBOX_DATABASE_URL if set, else the local
     server at 127.0.0.1:5432, else a throwaway cluster started from the
     PostgreSQL binaries on this machine (in --local-dir, stopped at the
     end); a fresh database (--demo-database, dropped first) on it
  2. the migrations
  3. a workload: usage snapshots across tenants with dedupe keys (some
     enqueued twice, as a retrying producer would), some with ordering
     keys, and a few poison messages
  4. a local plugin endpoint (outboxctl sink's receiver: signatures
     verified, webhook-ids deduplicated in PostgreSQL) that refuses the
     poison, throttles a few first attempts and loses a few answers
  5. the dispatch function's handler, run in-process until the queue is
     drained; with AWS_ENDPOINT_URL pointing at an emulator (moto_server,
     LocalStack) also SNS and EventBridge routes
  6. the reaper handler, the dead letters (outboxctl dead list) and a
     replay dry run (outboxctl replay)
  7. a summary: delivered, retried, dead, duplicates suppressed, throughput
     and latency from enqueue to delivery

The handlers' JSON logs and metrics go to --local-dir/demo.log.`,
		Example: `  make run
  outboxctl demo
  outboxctl demo --messages 100000 --tenants 500
  AWS_ENDPOINT_URL=http://127.0.0.1:5000 outboxctl demo      # with moto_server -p 5000
  outboxctl demo --postgres throwaway                         # ignore the local server`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case opts.messages < 10 || opts.messages > 1_000_000:
				return usagef("--messages must be between 10 and 1000000, got %d", opts.messages)
			case opts.tenants < 1 || opts.tenants > 10_000:
				return usagef("--tenants must be between 1 and 10000, got %d", opts.tenants)
			case opts.postgres != "auto" && opts.postgres != "throwaway":
				return usagef("--postgres must be auto or throwaway, got %q", opts.postgres)
			case opts.drainTime <= 0:
				return usagef("--timeout must be positive, got %s", opts.drainTime)
			}
			out := cmd.OutOrStdout()
			steps := out
			if opts.asJSON {
				steps = io.Discard
			}
			report, err := runDemo(cmd.Context(), g, opts, steps)
			if err != nil {
				return err
			}
			if opts.asJSON {
				return writeJSON(out, report)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.messages, "messages", 20_000, "usage snapshots to enqueue")
	f.IntVar(&opts.tenants, "tenants", 50, "tenants they are spread over")
	f.StringVar(&opts.postgres, "postgres", "auto", "auto: OUTBOX_DATABASE_URL, the local server or a throwaway cluster; throwaway: always a throwaway cluster")
	f.StringVar(&opts.database, "demo-database", "outbox_demo", "the database the demo creates afresh on the server")
	f.StringVar(&opts.localDir, "local-dir", ".local", "where the throwaway cluster and the demo's log live")
	f.DurationVar(&opts.drainTime, "timeout", 50*time.Second, "give up when the queue is not drained within this time")
	f.BoolVar(&opts.asJSON, "json", false, "print only the summary, as JSON")
	return cmd
}

// demoReport is the demo's summary (demo --json).
type demoReport struct {
	Postgres      string `json:"postgres"`
	Database      string `json:"database"`
	Migrations    int    `json:"migrations_applied"`
	Enqueued      int    `json:"enqueued"`
	Poison        int    `json:"poison"`
	Ordered       int    `json:"ordered"`
	EnqueueDedupe int    `json:"duplicates_suppressed_at_enqueue"`

	Delivered   int `json:"delivered"`
	Retried     int `json:"retried"`
	Dead        int `json:"dead"`
	LeaseLost   int `json:"lease_lost"`
	Invocations int `json:"dispatch_invocations"`
	// DeliveredByTarget counts deliveries per target type (http, sns,
	// eventbridge).
	DeliveredByTarget map[string]int `json:"delivered_by_target"`
	AWS               string         `json:"aws"`

	Sink            sinkStats `json:"sink"`
	SinkHandledKeys int       `json:"sink_handled_keys"`
	// SinkMissingKeys counts non-poison messages the sink never handled.
	SinkMissingKeys int `json:"sink_missing_keys"`

	Reaper      reaperfn.Summary `json:"reaper"`
	DeadLetters []string         `json:"dead_letters"`
	ReplayDry   replayfn.Summary `json:"replay_dry_run"`

	DispatchSeconds   float64 `json:"dispatch_seconds"`
	ThroughputPerSec  float64 `json:"throughput_per_second"`
	LatencyP50Millis  float64 `json:"latency_p50_ms"`
	LatencyP99Millis  float64 `json:"latency_p99_ms"`
	TotalSeconds      float64 `json:"total_seconds"`
	PendingAfterDrain int64   `json:"pending_after_drain"`
}

// runDemo is the demo, writing its steps to w.
func runDemo(ctx context.Context, g *globalOptions, opts demoOptions, w io.Writer) (rep demoReport, err error) {
	started := time.Now()
	step := func(n int, title, format string, args ...any) {
		fmt.Fprintf(w, "%d. %-13s %s\n", n, title, fmt.Sprintf(format, args...))
	}
	more := func(format string, args ...any) {
		fmt.Fprintf(w, "   %-13s %s\n", "", fmt.Sprintf(format, args...))
	}
	fmt.Fprintln(w, "outbox demo: the whole data path on this machine")
	fmt.Fprintln(w)

	// 1. PostgreSQL.
	server, err := findServer(ctx, g, opts.postgres, opts.localDir)
	if err != nil {
		return rep, err
	}
	if server.stop != nil {
		defer func() {
			if stopErr := server.stop(context.WithoutCancel(ctx)); stopErr != nil && err == nil {
				err = stopErr
			}
		}()
	}
	rep.Postgres = server.describe
	dbURL, err := freshDatabase(ctx, server.adminURL, opts.database)
	if err != nil {
		return rep, err
	}
	rep.Database = redact(dbURL)
	step(1, "PostgreSQL", "%s", server.describe)
	more("fresh database %s", opts.database)

	// 2. Migrations.
	m, err := migrations.Open(dbURL)
	if err != nil {
		return rep, err
	}
	applied, err := m.Up(ctx)
	m.Close()
	if err != nil {
		return rep, err
	}
	versions, functionFiles := 0, 0
	for _, r := range applied {
		if r.Version > 0 {
			versions++
		} else {
			functionFiles++
		}
	}
	rep.Migrations = versions
	step(2, "Migrations", "%d applied, and %d SQL functions (schema outbox: state machine, roles, NOTIFY trigger)", versions, functionFiles)

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return rep, err
	}
	defer pool.Close()
	store := lease.NewStore(pool)

	// AWS targets, when an emulator is configured.
	awsCfg, awsRoutes, awsNote, err := demoAWS(ctx, g)
	if err != nil {
		return rep, err
	}
	rep.AWS = awsNote

	// 3. The workload.
	work := buildWorkload(opts.messages, opts.tenants, len(awsRoutes) > 0, time.Now())
	enqueueStarted := time.Now()
	inserted, duplicates, err := enqueueWorkload(ctx, pool, work)
	if err != nil {
		return rep, err
	}
	enqueueTook := time.Since(enqueueStarted)
	rep.Enqueued, rep.EnqueueDedupe, rep.Poison, rep.Ordered = inserted, duplicates, work.poison, work.ordered
	step(3, "Enqueue", "%s messages in %s (%s/s), %d batches of up to 1,000 in their own transactions",
		count(inserted), enqueueTook.Round(time.Millisecond), count(int(float64(inserted)/enqueueTook.Seconds())), (len(work.messages)+999)/1000)
	more("%s usage snapshots for %d tenants, each with a dedupe key; %s with ordering keys; %d poison",
		count(opts.messages), opts.tenants, count(work.ordered), work.poison)
	more("%s enqueued again with the same dedupe keys: %s suppressed, nothing written", count(len(work.repeats)), count(duplicates))
	if work.toAWS > 0 {
		more("%s for the AWS routes (payments → SNS, audit → EventBridge)", count(work.toAWS))
	}

	// 4. The sink.
	secretKey := make([]byte, 32)
	_, _ = rand.Read(secretKey)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(secretKey)
	sinkPool, err := pgxpool.New(ctx, dbURL+sep(dbURL)+"pool_max_conns=16")
	if err != nil {
		return rep, err
	}
	defer sinkPool.Close()
	dedupe, err := sink.NewPostgresDeduper(ctx, sinkPool, "outbox_sink_dedupe")
	if err != nil {
		return rep, err
	}
	receiver := newLocalSink(secretKey, dedupe, []rejectRule{{field: "poison", value: "true"}}, 0, nil,
		sinkFaults{ThrottleEvery: 250, LoseAckEvery: 500}, slog.New(slog.DiscardHandler))
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rep, err
	}
	sinkCtx, stopSink := context.WithCancel(context.WithoutCancel(ctx))
	sinkDone := make(chan error, 1)
	go func() { sinkDone <- serveHTTP(sinkCtx, listener, receiver) }()
	defer func() {
		stopSink()
		<-sinkDone
	}()
	sinkURL := "http://" + listener.Addr().String() + "/usage"
	step(4, "Sink", "%s: Standard Webhooks signatures verified, webhook-ids deduplicated in table outbox_sink_dedupe", sinkURL)
	more("refuses payloads with poison=true (422); throttles 1 in 250 first attempts (429); loses 1 in 500 answers (503)")

	// 5. Dispatch until drained.
	logFile, err := demoLog(opts.localDir)
	if err != nil {
		return rep, err
	}
	defer logFile.Close()
	reaperCfg, dispatchCfg, err := demoConfig(dbURL, demoRoutes(sinkURL, awsRoutes), secret)
	if err != nil {
		return rep, err
	}
	deps := handler.Deps{Stdout: logFile, AWS: awsCfg}
	dispatcher, closeDispatcher, err := dispatchfn.New(ctx, dispatchCfg, deps)
	if err != nil {
		return rep, fmt.Errorf("dispatch: cold start failed: %w", err)
	}
	defer closeDispatcher()
	step(5, "Dispatch", "the dispatch function's handler, in-process, invoked until the queue is drained")
	total := int64(inserted)
	progress := newProgressBar(w, total)
	dispatchStarted := time.Now()
	sums, err := drain(ctx, dispatcher, store, opts.drainTime, func() {
		if pending, err := pendingCount(ctx, store); err == nil {
			progress.update(total-pending, time.Since(dispatchStarted))
		}
	})
	dispatchTook := time.Since(dispatchStarted)
	if pending, perr := pendingCount(ctx, store); perr == nil {
		rep.PendingAfterDrain = pending
		progress.finish(total-pending, dispatchTook)
	}
	if err != nil {
		return rep, err
	}
	rep.DeliveredByTarget = map[string]int{}
	for _, s := range sums {
		rep.Delivered += s.Delivered
		rep.Retried += s.Retried
		rep.Dead += s.Dead
		rep.LeaseLost += s.LeaseLost
		for kind, t := range s.Targets {
			rep.DeliveredByTarget[kind] += t.Delivered
		}
	}
	rep.Invocations = len(sums)
	rep.DispatchSeconds = dispatchTook.Seconds()
	rep.ThroughputPerSec = float64(rep.Delivered) / dispatchTook.Seconds()
	stats, latencies := receiver.snapshot()
	rep.Sink, rep.SinkHandledKeys = stats, receiver.handledKeys()
	for key := range work.expected {
		if !receiver.hasHandled(key) {
			rep.SinkMissingKeys++
		}
	}
	rep.LatencyP50Millis, rep.LatencyP99Millis = percentileMillis(latencies, 50), percentileMillis(latencies, 99)
	more("%d invocations; delivered %s; %s", len(sums), byTarget(rep.DeliveredByTarget), awsNote)

	// 6. The reaper.
	reaper, closeReaper, err := reaperfn.New(ctx, reaperCfg, deps)
	if err != nil {
		return rep, fmt.Errorf("reaper: cold start failed: %w", err)
	}
	rep.Reaper, err = reaper.Handle(ctx, json.RawMessage(`{}`))
	closeReaper()
	if err != nil {
		return rep, err
	}
	answer, _ := json.Marshal(rep.Reaper)
	step(6, "Reaper", "the reaper function's handler answered %s (no expired leases: nothing crashed)", answer)

	// 7. The dead letters, as `outboxctl dead list` shows them.
	letters, err := store.ListDead(ctx, lease.DeadFilter{Limit: 20})
	if err != nil {
		return rep, err
	}
	for _, d := range letters.Letters {
		rep.DeadLetters = append(rep.DeadLetters, d.ID.String())
	}
	step(7, "Dead letters", "$ outboxctl dead list")
	printDeadLetters(indent(w), letters, time.Now())

	// 8. A replay dry run, as `outboxctl replay` does it.
	dryRun := true
	req, err := parseReplayFlags(replayfn.Event{ErrorCode: "TARGET_REJECTED", DryRun: &dryRun, Operator: osUser()}, replayfn.DefaultLimit)
	if err != nil {
		return rep, err
	}
	step(8, "Replay", "$ outboxctl replay --error-code TARGET_REJECTED")
	if rep.ReplayDry, err = replay(ctx, indent(w), store, req, false); err != nil {
		return rep, err
	}

	rep.TotalSeconds = time.Since(started).Seconds()
	printDemoSummary(w, rep, server, dbURL, opts)
	return rep, nil
}

// demoConfig is the handlers' configuration: the defaults but for the
// database, the routes, and batches large enough to drain the demo's
// queue in a few invocations. The caller's own environment (say an
// OUTBOX_ROUTES_FILE, or an X-Ray daemon) does not leak in.
func demoConfig(dbURL, routes, sinkSecret string) (config.Reaper, dispatchconfig.Dispatch, error) {
	reaper, err := config.LoadReaper(config.Env{}.WithDatabaseURL(dbURL))
	if err != nil {
		return config.Reaper{}, dispatchconfig.Dispatch{}, err
	}
	table, err := route.Parse([]byte(routes), route.Options{})
	if err != nil {
		return config.Reaper{}, dispatchconfig.Dispatch{}, err
	}
	return reaper, dispatchconfig.Dispatch{
		Function:       reaper.Function,
		Engine:         dispatch.Config{BatchSize: 1000, MaxBatches: config.MaxMaxBatches},
		Routes:         table,
		SigningSecrets: map[string]string{config.SinkSecretVariable: sinkSecret},
	}, nil
}

// demoWebhookConcurrency is the sink route's target.concurrency: one signed
// POST per message, so it, not the outbox, bounds the run's throughput.
const demoWebhookConcurrency = 32

func demoRoutes(sinkURL string, awsRoutes []map[string]any) string {
	routes := []map[string]any{{
		"name":  "usage-webhook",
		"match": map[string]string{"namespace": "billing", "topic": "*"},
		"target": map[string]any{"type": "http", "url": sinkURL, "signing_secret_env": config.SinkSecretVariable,
			"timeout": "5s", "concurrency": demoWebhookConcurrency},
		// Quick retries, so the demo's injected failures resolve within
		// the run; production routes back off for minutes.
		"retry": map[string]any{"max_attempts": 8, "base_delay": "50ms", "max_delay": "500ms"},
	}}
	routes = append(routes, awsRoutes...)
	b, _ := json.Marshal(map[string]any{"routes": routes}) // maps of strings: cannot fail
	return string(b)
}

// demoAWS creates an SNS topic and an EventBridge bus on the emulator named
// by AWS_ENDPOINT_URL (or the per-service variables), and routes to them.
// Without an emulator it returns no routes and says how to add them.
func demoAWS(ctx context.Context, g *globalOptions) (*aws.Config, []map[string]any, string, error) {
	env := config.LoadDemo(g.env())
	endpoint := env.AWSEndpoint
	if endpoint == "" {
		// No AWS at all: an empty configuration, so that nothing looks
		// for credentials.
		return &aws.Config{Region: "us-east-1"}, nil, "SNS and EventBridge skipped (point AWS_ENDPOINT_URL at an emulator such as moto_server to include them)", nil
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, nil, "", fmt.Errorf("load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if !env.AWSCredentials {
		// Emulators accept any signature; do not go looking for real
		// credentials.
		cfg.Credentials = credentials.NewStaticCredentialsProvider("test", "test", "")
	}
	setupCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	topic, err := sns.NewFromConfig(cfg).CreateTopic(setupCtx, &sns.CreateTopicInput{Name: aws.String("outbox-demo-payments")})
	if err != nil {
		return nil, nil, "", fmt.Errorf("create the demo's SNS topic on %s: %w", endpoint, err)
	}
	const bus = "outbox-demo"
	if _, err := eventbridge.NewFromConfig(cfg).CreateEventBus(setupCtx, &eventbridge.CreateEventBusInput{Name: aws.String(bus)}); err != nil {
		var exists *ebtypes.ResourceAlreadyExistsException
		if !errors.As(err, &exists) {
			return nil, nil, "", fmt.Errorf("create the demo's EventBridge bus on %s: %w", endpoint, err)
		}
	}
	routes := []map[string]any{
		{"name": "payments-sns", "match": map[string]string{"namespace": "payments", "topic": "*"},
			"target": map[string]any{"type": "sns", "topic_arn": aws.ToString(topic.TopicArn)}},
		{"name": "audit-eventbridge", "match": map[string]string{"namespace": "audit", "topic": "*"},
			"target": map[string]any{"type": "eventbridge", "event_bus": bus, "source": "outbox.{namespace}", "detail_type": "{topic}"}},
	}
	return &cfg, routes, fmt.Sprintf("SNS topic %s and EventBridge bus %s on %s", aws.ToString(topic.TopicArn), bus, endpoint), nil
}

// enqueueWorkload enqueues the workload in batches of 1,000, each in its
// own transaction as a producer's would be, then the repeats.
func enqueueWorkload(ctx context.Context, pool *pgxpool.Pool, work workload) (inserted, duplicates int, err error) {
	for _, msgs := range [][]outbox.Message{work.messages, work.repeats} {
		for from := 0; from < len(msgs); from += 1000 {
			results, err := outbox.EnqueueBatch(ctx, pool, msgs[from:min(from+1000, len(msgs))])
			if err != nil {
				return 0, 0, err
			}
			for _, r := range results {
				if r.Inserted {
					inserted++
				} else {
					duplicates++
				}
			}
		}
	}
	return inserted, duplicates, nil
}

// drain invokes the dispatch handler, as its schedule would, until nothing
// is pending: retried messages are due again within the route's short
// backoff. tick is called between invocations and every 100ms.
func drain(ctx context.Context, h *dispatchfn.Handler, store *lease.Store, budget time.Duration, tick func()) ([]dispatch.Summary, error) {
	deadline := time.Now().Add(budget)
	stopTicking := make(chan struct{})
	var ticking sync.WaitGroup
	ticking.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopTicking:
				return
			case <-t.C:
				tick()
			}
		}
	})
	defer func() {
		close(stopTicking)
		ticking.Wait()
	}()
	var sums []dispatch.Summary
	for {
		// Each invocation gets a Lambda-like deadline.
		invokeCtx, cancel := context.WithTimeout(ctx, time.Minute)
		sum, err := h.Handle(invokeCtx, json.RawMessage(`{}`))
		cancel()
		sums = append(sums, sum.Summary)
		if err != nil {
			return sums, err
		}
		if sum.Claimed > 0 {
			continue
		}
		pending, err := pendingCount(ctx, store)
		if err != nil {
			return sums, err
		}
		if pending == 0 {
			return sums, nil
		}
		if time.Now().After(deadline) {
			return sums, fmt.Errorf("the queue was not drained within %s: %s messages still pending (see outboxctl status)", budget, count(pending))
		}
		// The rest wait for their retry time.
		select {
		case <-ctx.Done():
			return sums, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func pendingCount(ctx context.Context, store *lease.Store) (int64, error) {
	stats, err := store.Stats(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, s := range stats {
		n += s.Pending
	}
	return n, nil
}

func percentileMillis(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := min(len(ds)*p/100, len(ds)-1)
	return float64(ds[i].Microseconds()) / 1000
}

func printDemoSummary(w io.Writer, rep demoReport, server *demoServer, dbURL string, opts demoOptions) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Summary")
	tw := table(w)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "  %s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("delivered", "%s: %s", count(rep.Delivered), byTarget(rep.DeliveredByTarget))
	row("exactly once", "the sink handled %s keys, each %s (%d missing; the %s redeliveries of lost answers were answered \"duplicate\")",
		count(rep.SinkHandledKeys), times(rep.Sink.MaxHandledPerKey), rep.SinkMissingKeys, count(rep.Sink.Duplicates))
	row("retried", "%s (throttled or answer lost, delivered on a later attempt)", count(rep.Retried))
	row("dead", "%s (the poison messages, refused by the plugin: replay them once fixed)", count(rep.Dead))
	row("duplicates suppressed", "%s at enqueue (same dedupe key), %s at the sink (same webhook-id)", count(rep.EnqueueDedupe), count(rep.Sink.Duplicates))
	row("ordering", "%s ordered messages, %d out of order", count(rep.Ordered), rep.Sink.OrderViolations)
	row("throughput", "%s messages/s (%s in %.1fs; the webhook route keeps %d requests in flight, each a signed POST and a PostgreSQL transaction at the receiver)",
		count(int(rep.ThroughputPerSec)), count(rep.Delivered), rep.DispatchSeconds, demoWebhookConcurrency)
	row("latency p50 / p99", "%s / %s from enqueue to delivery at the sink (all enqueued up front, so mostly time queued)",
		millis(rep.LatencyP50Millis), millis(rep.LatencyP99Millis))
	row("took", "%.1fs in all", rep.TotalSeconds)
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Logs and metrics of the handlers: %s/demo.log\n", opts.localDir)
	if server.persistent {
		fmt.Fprintln(w, "Explore the result (make run built bin/outboxctl; make outboxctl builds it):")
		for _, line := range exploreLines(dbURL, rep) {
			fmt.Fprintln(w, "  "+line)
		}
	} else {
		fmt.Fprintln(w, "The throwaway cluster is stopped; its data stays in "+opts.localDir+"/pg for the next run.")
	}
}

// exploreLines are the commands the demo's summary suggests, each to be
// run as printed from the repository's root: a test runs them.
func exploreLines(dbURL string, rep demoReport) []string {
	lines := []string{
		fmt.Sprintf("export OUTBOX_DATABASE_URL='%s'", redact(dbURL)),
		"bin/outboxctl status",
		"bin/outboxctl dead list",
	}
	if len(rep.DeadLetters) > 0 {
		lines = append(lines, "bin/outboxctl dead show "+rep.DeadLetters[0])
	}
	return append(lines, "bin/outboxctl replay --error-code TARGET_REJECTED")
}

// byTarget lists deliveries per target type: "19,995 http, 500 sns".
func byTarget(delivered map[string]int) string {
	parts := make([]string, 0, len(delivered))
	for _, kind := range slices.Sorted(maps.Keys(delivered)) {
		parts = append(parts, fmt.Sprintf("%s %s", count(delivered[kind]), kind))
	}
	return strings.Join(parts, ", ")
}

// times says how often: "once", "twice", "3 times".
func times(n int) string {
	switch n {
	case 0:
		return "never"
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return fmt.Sprintf("at most %d times", n)
}

// millis shows a latency to the millisecond: 850ms, 3.182s.
func millis(ms float64) string {
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Millisecond).String()
}

// progressBar draws the dispatch's progress: redrawn in place on a
// terminal, once at the end elsewhere (a log, a test).
type progressBar struct {
	w     io.Writer
	total int64
	live  bool
	mu    sync.Mutex
}

func newProgressBar(w io.Writer, total int64) *progressBar {
	return &progressBar{w: w, total: total, live: isTerminal(w)}
}

func (p *progressBar) render(done int64, took time.Duration) string {
	const width = 30
	filled := 0
	if p.total > 0 {
		filled = int(done * width / p.total)
	}
	filled = min(max(filled, 0), width)
	rate := 0
	if took > 0 {
		rate = int(float64(done) / took.Seconds())
	}
	return fmt.Sprintf("   %-13s [%s%s] %s/%s  %.1fs  %s/s", "", strings.Repeat("█", filled), strings.Repeat("░", width-filled),
		count(done), count(p.total), took.Seconds(), count(rate))
}

func (p *progressBar) update(done int64, took time.Duration) {
	if !p.live {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r%s", p.render(done, took))
}

func (p *progressBar) finish(done int64, took time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live {
		fmt.Fprint(p.w, "\r")
	}
	fmt.Fprintln(p.w, p.render(done, took))
}

// indent shifts a block of output under the demo's step titles.
func indent(w io.Writer) io.Writer { return &indentWriter{w: w, atStart: true} }

type indentWriter struct {
	w       io.Writer
	atStart bool
}

func (iw *indentWriter) Write(b []byte) (int, error) {
	var out []byte
	for _, c := range b {
		if iw.atStart {
			out = append(out, "   "...)
			iw.atStart = false
		}
		out = append(out, c)
		if c == '\n' {
			iw.atStart = true
		}
	}
	if _, err := iw.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

func sep(connString string) string {
	if strings.Contains(connString, "?") {
		return "&"
	}
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		return "?"
	}
	return " "
}
