package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/lease"
)

func newPendingCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pending list",
		Short: "List pending messages: where each stands, its last error, and what an ordered one waits behind",
		// A missing or unknown subcommand: finishCommandTree.
	}
	cmd.AddCommand(newPendingListCommand(g))
	return cmd
}

func newPendingListCommand(g *globalOptions) *cobra.Command {
	var (
		f         lease.PendingFilter
		ids       []string
		olderThan string
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List pending messages, longest available first",
		Long: `List the messages still to be delivered, longest available first, from
outbox.pending_messages(). STATE says where each stands:

  due            waiting for a claim now
  retrying       it failed (CODE, ERROR) and waits for NEXT ATTEMPT
  scheduled      its producer made it available later (NEXT ATTEMPT)
  behind         an earlier message of its ordering key goes first: WAITS BEHIND
                 names the key's head (its sequence, state and code), or its
                 parked dead letter, or "unsettled" (the next claim settles it)
  paused         its namespace or topic is paused (outboxctl status lists who
                 paused it and why; outboxctl resume)
  leased         a dispatcher is delivering it now
  lease_expired  its dispatcher died or overran; the next claim or the reaper
                 takes it back

Errors are cut to fit the table; --json has them whole.`,
		Example: `  outboxctl pending list
  outboxctl pending list --namespace billing --retrying --older-than 10m
  outboxctl pending list --namespace payments --ordering-key acct-42
  outboxctl pending list --blocked --limit 20
  outboxctl pending list --retrying --json | jq -r '.messages[].id'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.Limit < 1 || f.Limit > 10_000 {
				return usagef("--limit must be between 1 and 10000, got %d", f.Limit)
			}
			if f.OrderingKey != "" && f.Namespace == "" {
				return usagef("--ordering-key needs --namespace: ordering keys are scoped by namespace")
			}
			var err error
			if f.MessageIDs, err = parseIDs("--id", ids); err != nil {
				return err
			}
			if olderThan != "" {
				if f.OlderThan, err = parseAge("--older-than", olderThan); err != nil {
					return err
				}
			}
			return list(cmd, g, asJSON, func(store *lease.Store) (lease.PendingMessages, error) {
				return store.ListPending(cmd.Context(), f)
			}, printPending)
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&ids, "id", nil, "a message id (repeatable)")
	fs.StringVar(&f.Namespace, "namespace", "", "only this namespace")
	fs.StringVar(&f.Topic, "topic", "", "only this topic")
	fs.StringVar(&f.OrderingKey, "ordering-key", "", "only this ordering key (with --namespace)")
	fs.BoolVar(&f.Retrying, "retrying", false, "only messages that failed at least once")
	fs.BoolVar(&f.Blocked, "blocked", false, "only messages of ordering keys that cannot move (outboxctl blocked)")
	fs.StringVar(&olderThan, "older-than", "", "only messages available longer ago than this (90s, 10m, 2h, 3d)")
	fs.IntVar(&f.Limit, "limit", 100, "list at most this many")
	fs.BoolVar(&asJSON, "json", false, "print JSON, errors whole")
	return cmd
}

func printPending(w io.Writer, page lease.PendingMessages, now time.Time) {
	if len(page.Messages) == 0 {
		fmt.Fprintln(w, "no pending messages match")
		return
	}
	tw := table(w)
	fmt.Fprintln(tw, "ID\tNAMESPACE/TOPIC\tKEY/SEQ\tSTATE\tATTEMPTS\tCODE\tERROR\tNEXT ATTEMPT\tAGE\tWAITS BEHIND")
	for _, m := range page.Messages {
		key := "-"
		if m.OrderingKey != "" {
			key = fmt.Sprintf("%s/%d", truncate(m.OrderingKey, 24), m.SequenceID)
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n",
			m.ID, m.Namespace, m.Topic, key, m.State, m.AttemptCount, orDash(m.LastErrorCode),
			orDash(truncate(m.LastError, 48)), nextAttempt(m, now), humanAge(now.Sub(m.AvailableAt)), waitsBehind(m.WaitsBehind))
	}
	tw.Flush()
	if page.Matched > int64(len(page.Messages)) {
		fmt.Fprintf(w, "%s of %s matching messages shown (--limit)\n", count(len(page.Messages)), count(page.Matched))
	}
}

// nextAttempt says when a message will next be tried: "now" when due, a
// time ahead, or "-" when that is not up to the clock.
func nextAttempt(m lease.PendingMessage, now time.Time) string {
	switch m.State {
	case lease.PendingRetrying, lease.PendingScheduled:
		return "in " + humanAge(m.NextAttemptAt.Sub(now))
	case lease.PendingDue:
		return "now"
	case lease.PendingLeased:
		if m.LeaseExpires != nil {
			return fmt.Sprintf("held by %s, lease ends in %s", m.ClaimedBy, humanAge(m.LeaseExpires.Sub(now)))
		}
	case lease.PendingLeaseExpired:
		return fmt.Sprintf("held by %s, lease expired: taken back by the next claim", m.ClaimedBy)
	}
	return "-"
}

func waitsBehind(h *lease.KeyHead) string {
	switch {
	case h == nil:
		return "-"
	case h.ID == nil:
		return h.State
	default:
		s := fmt.Sprintf("%s (seq %d, %s", h.ID, h.SequenceID, h.State)
		if h.ErrorCode != "" {
			s += " " + h.ErrorCode
		}
		return s + ")"
	}
}

// parseIDs reads message ids given to flag (or as arguments).
func parseIDs(flag string, values []string) ([]uuid.UUID, error) {
	var out []uuid.UUID
	for _, v := range values {
		id, err := uuid.Parse(v)
		if err != nil {
			return nil, usagef("%s: %q is not a message id", flag, v)
		}
		out = append(out, id)
	}
	return out, nil
}

// parseAge reads a duration as an operator writes one: Go's units (90s,
// 10m, 2h) and days (3d, 1d12h).
func parseAge(flag, value string) (time.Duration, error) {
	rest, days := value, 0
	if i := strings.Index(rest, "d"); i > 0 {
		n, err := strconv.Atoi(rest[:i])
		if err == nil && n >= 0 {
			days, rest = n, rest[i+1:]
		}
	}
	d := time.Duration(0)
	if rest != "" {
		var err error
		if d, err = time.ParseDuration(rest); err != nil || d < 0 {
			return 0, usagef("%s wants a duration such as 90s, 10m, 2h or 3d, got %q", flag, value)
		}
	} else if days == 0 && value != "0d" {
		return 0, usagef("%s wants a duration such as 90s, 10m, 2h or 3d, got %q", flag, value)
	}
	return time.Duration(days)*24*time.Hour + d, nil
}
