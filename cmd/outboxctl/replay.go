package main

import (
	"context"
	"fmt"
	"io"
	"os/user"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/handler/replayfn"
	"github.com/outboxkit/dispatcher/shared/lease"
)

func newReplayCommand(g *globalOptions) *cobra.Command {
	var (
		filter   deadFilterFlags
		all      bool
		yes      bool
		reason   string
		operator string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Move dead letters back to the queue (a dry run unless --yes)",
		Long: `Replay moves the dead letters the filters match back to outbox.pending, due
now, with the same id and sequence id and a fresh attempt count. It takes the
replay function's filters and validates them the same way.

By default it is a dry run: it lists what would move and changes nothing.
With --yes it moves them, recording a REPLAYED attempt with the operator (the
OS user unless --operator) and the --reason, which --yes requires. An empty
filter is refused unless --all.`,
		Example: `  outboxctl replay --error-code TARGET_REJECTED                # dry run: what would move
  outboxctl replay --namespace billing --failed-after 2h --yes --reason "INC-4211: billing endpoint fixed"
  outboxctl replay --id 0193a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d --yes --reason "payload corrected upstream"
  outboxctl replay --all --limit 1000 --yes --reason "SNS topic policy restored"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ev, err := filter.event(time.Now())
			if err != nil {
				return err
			}
			if reason != "" && !yes {
				return usagef("--reason is recorded only when messages move: add --yes, or drop --reason for a dry run")
			}
			dryRun := !yes
			ev.All, ev.DryRun, ev.Reason = all, &dryRun, reason
			ev.Operator = operator
			if ev.Operator == "" {
				ev.Operator = osUser()
			}
			maxLimit, err := config.ReplayMaxLimit(g.env())
			if err != nil {
				return usageError{err}
			}
			req, err := parseReplayFlags(ev, maxLimit)
			if err != nil {
				return err
			}
			return g.withStore(cmd.Context(), func(_ *dbpool.Pool, store *lease.Store) error {
				_, err = replay(cmd.Context(), cmd.OutOrStdout(), store, req, asJSON)
				return err
			})
		},
	}
	filter.register(cmd.Flags(), fmt.Sprintf("replay at most this many, oldest first (default %d, at most $OUTBOX_REPLAY_MAX_LIMIT, %d)",
		replayfn.DefaultLimit, config.DefaultReplayMaxLimit))
	cmd.Flags().BoolVar(&all, "all", false, "allow an empty filter: every dead letter (up to --limit)")
	cmd.Flags().BoolVar(&yes, "yes", false, "move the messages (default: a dry run that only lists them)")
	cmd.Flags().StringVar(&reason, "reason", "", "why they are replayed, recorded on each REPLAYED attempt (required with --yes)")
	cmd.Flags().StringVar(&operator, "operator", "", "who replays them, recorded with the reason (default: the OS user)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the replay function's answer as JSON")
	return cmd
}

// replay runs a validated request: the dry run lists what matches; a real
// run moves it and lists what moved. Its answer, and its JSON, are the
// replay function's.
func replay(ctx context.Context, w io.Writer, store *lease.Store, req lease.ReplayRequest, asJSON bool) (replayfn.Summary, error) {
	dry := req
	dry.DryRun = true
	matched, err := store.ReplayDead(ctx, dry)
	if err != nil {
		return replayfn.Summary{}, err
	}
	// Read the letters before they move: afterwards they are pending rows.
	var letters lease.DeadLetters
	if len(matched) > 0 {
		if letters, err = store.ListDead(ctx, lease.DeadFilter{MessageIDs: matched, Limit: len(matched)}); err != nil {
			return replayfn.Summary{}, err
		}
	}
	summary := replayfn.Summary{Matched: len(matched), DryRun: req.DryRun, MessageIDs: idStrings(matched)}
	var moved []uuid.UUID
	if !req.DryRun && len(matched) > 0 {
		if moved, err = store.ReplayDead(ctx, req); err != nil {
			return replayfn.Summary{}, err
		}
		summary.Replayed, summary.MessageIDs = len(moved), idStrings(moved)
		letters = only(letters, moved)
	}
	if asJSON {
		return summary, writeJSON(w, summary)
	}
	switch {
	case len(matched) == 0:
		fmt.Fprintln(w, "no dead letters match")
		return summary, nil
	case req.DryRun:
		fmt.Fprintf(w, "dry run: %s dead letter%s would be replayed (add --yes --reason \"…\" to move %s):\n",
			count(len(matched)), plural(len(matched)), them(len(matched)))
	default:
		fmt.Fprintf(w, "replayed %s dead letter%s back to pending as %s (reason: %s):\n",
			count(len(moved)), plural(len(moved)), req.Operator, req.Reason)
	}
	printDeadLetters(w, letters, time.Now())
	if !req.DryRun && len(moved) < len(matched) {
		fmt.Fprintf(w, "%s matched but were not moved: another replay took them first\n", count(len(matched)-len(moved)))
	}
	return summary, nil
}

func only(letters lease.DeadLetters, ids []uuid.UUID) lease.DeadLetters {
	keep := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		keep[id] = true
	}
	out := lease.DeadLetters{Letters: []lease.DeadLetter{}}
	for _, d := range letters.Letters {
		if keep[d.ID] {
			out.Letters = append(out.Letters, d)
		}
	}
	out.Matched = len(out.Letters)
	return out
}

func idStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// osUser names the operator of a replay.
func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "outboxctl"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func them(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}
