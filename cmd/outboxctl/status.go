package main

import (
	"context"
	"fmt"
	"github.com/outboxkit/dispatcher/shared/gate"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/handler/metricsfn"
	"github.com/outboxkit/dispatcher/shared/lease"
)

// defaultWatchInterval is --watch's interval when none is given.
const defaultWatchInterval = 2 * time.Second

func newStatusCommand(g *globalOptions) *cobra.Command {
	var (
		watch  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status [--watch [INTERVAL]]",
		Short: "Show the queue per namespace/topic: due, retrying, blocked, leased, paused, oldest age, top error, dead",
		Long: `Show the queue per namespace/topic, from outbox.stats():

  PENDING   undelivered messages, leased or not
  DUE       unleased and due now: waiting for a dispatcher
  RETRYING  failed, waiting for their next attempt (outboxctl pending list --retrying)
  BLOCKED   ordering keys that cannot move (outboxctl blocked)
  LEASED    held by a dispatcher right now
  EXPIRED   leases past their expiry: a dispatcher died or overran; the reaper requeues them
  PAUSED    of a paused namespace or topic: not claimed until resumed
  OLDEST    how long the oldest available message has waited (paused ones aside)
  TOP ERROR the most frequent last error code of the topic's pending and dead messages, and how many
  DEAD      dead letters (outboxctl dead list)

Below the table: the pauses in force, by whom and why, and what to do next.

--watch redraws every INTERVAL (default 2s) until interrupted.`,
		Example: `  outboxctl status
  outboxctl status --watch           # every 2s
  outboxctl status --watch 500ms
  outboxctl status --json | jq '.totals.oldest_pending_age_seconds'`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			watching := cmd.Flags().Changed("watch")
			// "--watch 5s" parses as a bare --watch and an argument: take
			// the argument as the interval.
			if watching && watch == defaultWatchInterval.String() && len(args) == 1 {
				watch, args = args[0], nil
			}
			if len(args) > 0 {
				return usagef("status takes no arguments, got %q", args[0])
			}
			var interval time.Duration
			if watching {
				d, err := time.ParseDuration(watch)
				if err != nil || d < 100*time.Millisecond {
					return usagef("--watch wants an interval of at least 100ms, such as 2s, got %q", watch)
				}
				interval = d
			}
			return g.withStore(cmd.Context(), func(pool *dbpool.Pool, store *lease.Store) error {
				return showStatus(cmd.Context(), cmd.OutOrStdout(), store, pool, interval, asJSON)
			})
		},
	}
	cmd.Flags().StringVar(&watch, "watch", "", "refresh every INTERVAL until interrupted (default 2s)")
	cmd.Flags().Lookup("watch").NoOptDefVal = defaultWatchInterval.String()
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (with --watch, one document per line)")
	return cmd
}

// statusDoc is status --json.
type statusDoc struct {
	GeneratedAt time.Time          `json:"generated_at"`
	Topics      []lease.TopicStats `json:"topics"`
	Totals      metricsfn.Totals   `json:"totals"`
	// Pauses are the pauses in force: who paused what, when and why.
	Pauses []lease.Pause `json:"pauses"`
	// OpenBreakers are the targets whose circuit breaker is open.
	OpenBreakers []gate.OpenBreaker `json:"open_breakers"`
}

func showStatus(ctx context.Context, w io.Writer, store *lease.Store, db gate.Querier, interval time.Duration, asJSON bool) error {
	redraw := interval > 0 && !asJSON && isTerminal(w)
	for {
		stats, err := store.Stats(ctx)
		var pauses []lease.Pause
		if err == nil {
			pauses, err = store.Pauses(ctx)
		}
		var breakers []gate.OpenBreaker
		if err == nil {
			breakers, err = gate.OpenBreakers(ctx, db)
		}
		if err != nil {
			if ctx.Err() != nil && interval > 0 {
				return nil // interrupted while reading
			}
			return err
		}
		now := time.Now()
		switch {
		case asJSON && interval > 0:
			if err := writeJSONLine(w, statusOf(stats, pauses, breakers, now)); err != nil {
				return err
			}
		case asJSON:
			if err := writeJSON(w, statusOf(stats, pauses, breakers, now)); err != nil {
				return err
			}
		default:
			if redraw {
				fmt.Fprint(w, "\033[H\033[2J") // home, clear: redraw in place
			}
			if interval > 0 {
				fmt.Fprintf(w, "outbox status at %s, every %s (interrupt to stop)\n\n", now.Format("15:04:05"), interval)
			}
			printStatus(w, stats, pauses, breakers)
			if interval > 0 && !redraw {
				fmt.Fprintln(w)
			}
		}
		if interval == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

func statusOf(stats []lease.TopicStats, pauses []lease.Pause, breakers []gate.OpenBreaker, now time.Time) statusDoc {
	doc := statusDoc{GeneratedAt: now.UTC(), Topics: stats, Pauses: pauses, OpenBreakers: breakers}
	if doc.OpenBreakers == nil {
		doc.OpenBreakers = []gate.OpenBreaker{}
	}
	if doc.Topics == nil {
		doc.Topics = []lease.TopicStats{}
	}
	if doc.Pauses == nil {
		doc.Pauses = []lease.Pause{}
	}
	// The metrics function's totals, so that the two agree.
	doc.Totals = metricsfn.BuildSnapshot(stats, 0, now).Totals
	return doc
}

func printStatus(w io.Writer, stats []lease.TopicStats, pauses []lease.Pause, breakers []gate.OpenBreaker) {
	now := time.Now()
	if len(stats) == 0 {
		fmt.Fprintln(w, "the outbox is empty: nothing pending, no dead letters")
		printPauses(w, pauses, now)
		printBreakers(w, breakers, now)
		return
	}
	t := statusOf(stats, pauses, breakers, now).Totals
	oldest := func(pending int64, s float64) string {
		if pending == 0 {
			return "-"
		}
		return humanAge(seconds(s))
	}
	tw := table(w)
	topError := func(s lease.TopicStats) string {
		if s.TopErrorCode == "" {
			return "-"
		}
		return fmt.Sprintf("%s ×%s", s.TopErrorCode, count(s.TopErrorCount))
	}
	fmt.Fprintln(tw, "NAMESPACE\tTOPIC\tPENDING\tDUE\tRETRYING\tBLOCKED\tLEASED\tEXPIRED\tPAUSED\tOLDEST\tTOP ERROR\tDEAD")
	for _, s := range stats {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Namespace, s.Topic, count(s.Pending), count(s.Due),
			count(s.Retrying), count(s.BlockedKeys), count(s.Leased), count(s.ExpiredLeases), count(s.Paused),
			oldest(s.Pending-s.Paused, s.OldestPendingAgeSeconds), topError(s), count(s.Dead))
	}
	fmt.Fprintf(tw, "TOTAL\t\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\t%s\n", count(t.Pending), count(t.Due), count(t.Retrying),
		count(t.BlockedKeys), count(t.Leased), count(t.ExpiredLeases), count(t.Paused),
		oldest(t.Pending-t.Paused, t.OldestPendingAgeSeconds), count(t.Dead))
	tw.Flush()
	printPauses(w, pauses, now)
	printBreakers(w, breakers, now)
	// What to do about what is stuck.
	if t.ExpiredLeases > 0 {
		fmt.Fprintf(w, "\n%s expired lease%s: a dispatcher died or overran its lease; the reaper requeues them (outboxctl invoke reaper)\n",
			count(t.ExpiredLeases), plural(int(t.ExpiredLeases)))
	}
	if t.Retrying > 0 {
		fmt.Fprintf(w, "\n%s message%s retrying: see their errors with outboxctl pending list --retrying; once the target is fixed, outboxctl retry ID... --yes --reason \"…\"\n",
			count(t.Retrying), plural(int(t.Retrying)))
	}
	if t.BlockedKeys > 0 {
		fmt.Fprintf(w, "\n%s blocked ordering key%s: see which, since when and why with outboxctl blocked\n", count(t.BlockedKeys), plural(int(t.BlockedKeys)))
	}
	if t.Dead > 0 {
		fmt.Fprintf(w, "\n%s dead letter%s: see why with outboxctl dead list; replay with outboxctl replay\n", count(t.Dead), plural(int(t.Dead)))
	}
}

// printBreakers lists the open circuit breakers, for status: their
// targets' messages are held until the next probe.
func printBreakers(w io.Writer, breakers []gate.OpenBreaker, now time.Time) {
	if len(breakers) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%d circuit breaker%s open (the target's messages are held, no attempt spent, until a probe succeeds):\n",
		len(breakers), plural(len(breakers)))
	tw := table(w)
	fmt.Fprintln(tw, "TARGET\tSINCE\tNEXT PROBE\tWHY")
	for _, b := range breakers {
		next := "due now"
		if d := b.NextProbe.Sub(now); d > 0 {
			next = "in " + humanAge(d)
		}
		fmt.Fprintf(tw, "%s\t%s ago\t%s\t%s\n", truncate(b.Target, 60), humanAge(now.Sub(b.Since)), next, truncate(orDash(b.LastError), 80))
	}
	tw.Flush()
}
