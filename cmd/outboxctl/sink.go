package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/sink"
)

// sinkPoolSize bounds the deliveries the sink records at once: each holds a
// connection and a transaction while it is handled, and the dispatcher sends
// several at a time.
const sinkPoolSize = 16

func newSinkCommand(g *globalOptions) *cobra.Command {
	var (
		listen  string
		secret  string
		table   string
		rejects []string
		delay   time.Duration
		quiet   bool
	)
	cmd := &cobra.Command{
		Use:   "sink",
		Short: "Run a local plugin endpoint that verifies, deduplicates and prints webhook deliveries",
		Long: `Run a local HTTP plugin endpoint built on shared/sink, the reference receiver
plugin authors import. It verifies each delivery's Standard Webhooks
signature with the secret (--secret, or $OUTBOX_SINK_SECRET; "whsec_…" or
base64), records its webhook-id in a table of the database (created when
missing) so that a redelivery is answered "duplicate" without being handled
again, and prints one line per request: its answer, the message id, key,
namespace/topic and attempt.

Answers: 200 delivered or duplicate; 400/401 for a malformed or forged
request (terminal for the dispatcher); 422 for a payload refused by
--reject-if (terminal: the message is dead-lettered); 5xx when the database
is unavailable (retried).

Point an http route at it: {"type":"http","url":"http://127.0.0.1:8080/",
"signing_secret_env":"OUTBOX_SINK_SECRET"} (plain http is allowed to
localhost).`,
		Example: `  export OUTBOX_SINK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
  outboxctl sink
  outboxctl sink --listen 127.0.0.1:9000 --reject-if poison=true --reject-if tenant=t-banned
  outboxctl sink --delay 2s          # a slow endpoint, to watch leases and shutdowns`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if secret == "" {
				secret = config.SinkSecret(g.env())
			}
			if secret == "" {
				return usagef("no signing secret: set %s or pass --secret (whsec_… or base64, the one the route's signing_secret_env names)", config.SinkSecretVariable)
			}
			key, err := webhook.ParseSecret(secret)
			if err != nil {
				return usageError{err}
			}
			var rules []rejectRule
			for _, r := range rejects {
				rule, err := parseRejectRule(r)
				if err != nil {
					return err
				}
				rules = append(rules, rule)
			}
			if delay < 0 {
				return usagef("--delay must not be negative, got %s", delay)
			}
			ctx := cmd.Context()
			pool, _, err := g.connectWithPool(ctx, sinkPoolSize)
			if err != nil {
				return err
			}
			defer pool.Close()
			dedupe, err := sink.NewPostgresDeduper(ctx, pool.Pool, table)
			if err != nil {
				return usageError{err}
			}
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return usagef("--listen %s: %v", listen, err)
			}
			out := cmd.OutOrStdout()
			lineOut := out
			if quiet {
				lineOut = nil
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			receiver := newLocalSink(key, dedupe, rules, delay, lineOut, sinkFaults{}, log)
			url := "http://" + l.Addr().String() + "/"
			fmt.Fprintf(out, "sink listening on %s (any path), verifying Standard Webhooks signatures; webhook-ids recorded in table %s\n", url, table)
			if len(rules) > 0 {
				names := make([]string, len(rules))
				for i, r := range rules {
					names[i] = r.String()
				}
				fmt.Fprintf(out, "rejecting payloads with %s (422: the dispatcher dead-letters them)\n", strings.Join(names, " or "))
			}
			fmt.Fprintf(out, "route to it: {\"match\":{\"namespace\":\"*\",\"topic\":\"*\"},\"target\":{\"type\":\"http\",\"url\":%q,\"signing_secret_env\":%q}}\n", url, config.SinkSecretVariable)
			return serveHTTP(ctx, l, receiver)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "address to listen on (port 0: any free port)")
	f.StringVar(&secret, "secret", "", "the signing secret (default $"+config.SinkSecretVariable+"; prefer the variable: flags show in ps)")
	f.StringVar(&table, "dedupe-table", "outbox_sink_dedupe", "the table (name or schema.name) recording handled webhook-ids")
	f.StringArrayVar(&rejects, "reject-if", nil, "refuse payloads whose top-level FIELD=VALUE, with 422 (repeatable)")
	f.DurationVar(&delay, "delay", 0, "wait this long before answering each request (a slow endpoint)")
	f.BoolVar(&quiet, "quiet", false, "do not print a line per request")
	return cmd
}

// serveHTTP serves h on l until ctx ends, then lets requests in flight
// finish (up to 10s).
func serveHTTP(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("stop the sink: %w", err)
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
