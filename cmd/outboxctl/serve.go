package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/serve"
)

func newServeCommand(g *globalOptions) *cobra.Command {
	var cfg serve.Config
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a long-lived dispatcher, woken by LISTEN/NOTIFY, for sub-second delivery",
		Long: `Run the dispatch engine as a long-lived process instead of a scheduled Lambda
function: for deployments that need sub-second latency, or that run outside
Lambda (a container, a VM, a laptop). It is configured exactly like the
dispatch function (OUTBOX_ROUTES, OUTBOX_ROUTES_FILE or OUTBOX_ROUTES_SSM_PARAMETER, OUTBOX_BATCH_SIZE,
the database variables, the AWS SDK's own settings) and can run next to it:
both claim with the same leases.

It listens on channel outbox_pending, which a trigger on outbox.pending
(pending_notify) notifies at every producer commit, waits --debounce for
the burst to end, and claims batch after batch until the queue is drained.
It also polls every --poll-interval, for notifications that were lost and
retries that became due, and runs the reaper every --reaper-interval.

SIGTERM or SIGINT stops claiming; the batch in hand is delivered and
completed (at most --shutdown-timeout, after which it is completed as
retryable), and the process exits 0. Logs are JSON lines on stdout, and so
are the metrics, every --metrics-interval: the dispatch function's names
(Claimed, Delivered, Retried, DeadLettered, LeaseLost, Batches) and the
wake-ups (NotifyWakeups, Polls) in CloudWatch Embedded Metric Format, which
the CloudWatch agent or a log shipper turns into metrics.`,
		Example: `  OUTBOX_ROUTES_FILE=routes.yaml outboxctl serve
  outboxctl serve --poll-interval 5s --reaper-interval 0     # the reaper function runs elsewhere
  OUTBOX_LOG_LEVEL=debug outboxctl serve --debounce 50ms      # a line per batch`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case cfg.PollInterval < 10*time.Millisecond:
				return usagef("--poll-interval must be at least 10ms, got %s", cfg.PollInterval)
			case cfg.Debounce <= 0:
				return usagef("--debounce must be positive, got %s", cfg.Debounce)
			case cfg.ReaperInterval < 0:
				return usagef("--reaper-interval must not be negative (0 turns the reaper off), got %s", cfg.ReaperInterval)
			case cfg.MetricsInterval <= 0:
				return usagef("--metrics-interval must be positive, got %s", cfg.MetricsInterval)
			case cfg.ShutdownTimeout <= 0:
				return usagef("--shutdown-timeout must be positive, got %s", cfg.ShutdownTimeout)
			case cfg.BatchSize < 0:
				return usagef("--batch-size must not be negative, got %d", cfg.BatchSize)
			}
			ctx := cmd.Context()
			setup, err := dispatchconfig.LoadServe(g.env(), cfg.ReaperInterval > 0)
			if err != nil {
				// The dispatch function's cold start would fail the same way.
				return fmt.Errorf("serve: cannot start: %w", err)
			}
			s, closeFn, err := serve.Open(ctx, setup, handler.Deps{Stdout: cmd.OutOrStdout()}, cfg)
			if err != nil {
				// The dispatch function's cold start would fail the same way.
				return fmt.Errorf("serve: cannot start: %w", err)
			}
			defer closeFn()
			// The context is cancelled by SIGTERM or SIGINT (see main).
			return s.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&cfg.PollInterval, "poll-interval", serve.DefaultPollInterval, "claim at least this often, notified or not")
	f.DurationVar(&cfg.Debounce, "debounce", serve.DefaultDebounce, "after a notification, wait this long for more commits before claiming")
	f.DurationVar(&cfg.ReaperInterval, "reaper-interval", time.Minute, "run the reaper this often, and at start (0: never)")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", serve.DefaultShutdownTimeout, "on SIGTERM, how long the batch in hand may take")
	f.DurationVar(&cfg.MetricsInterval, "metrics-interval", serve.DefaultMetricsInterval, "print the dispatch metrics (CloudWatch EMF on stdout, NotifyWakeups and Polls among them) this often, and at exit")
	f.IntVar(&cfg.BatchSize, "batch-size", 0, fmt.Sprintf("messages per claim (default $OUTBOX_BATCH_SIZE, %d)", config.DefaultBatchSize))
	return cmd
}
