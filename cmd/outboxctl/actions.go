package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/lease"
)

// actionFlags are the guard every audited action shares with replay: a
// dry run unless --yes, which needs a --reason; the operator defaults to
// the OS user.
type actionFlags struct {
	yes      bool
	reason   string
	operator string
	asJSON   bool
}

func (a *actionFlags) register(cmd *cobra.Command, what string) {
	cmd.Flags().BoolVar(&a.yes, "yes", false, what+" (default: a dry run that only says what would change)")
	cmd.Flags().StringVar(&a.reason, "reason", "", "why, kept in the audit trail (required with --yes)")
	cmd.Flags().StringVar(&a.operator, "operator", "", "who acts, recorded with the reason (default: the OS user)")
	cmd.Flags().BoolVar(&a.asJSON, "json", false, "print what changed as JSON")
}

// check refuses a --yes without a reason, and a reason without --yes
// (it would be recorded nowhere).
func (a *actionFlags) check() error {
	switch {
	case a.yes && a.reason == "":
		return usagef("--yes needs a --reason: it is kept in the audit trail")
	case !a.yes && a.reason != "":
		return usagef("--reason is recorded only when something changes: add --yes, or drop --reason for a dry run")
	}
	if a.operator == "" {
		a.operator = osUser()
	}
	return nil
}

func newRetryCommand(g *globalOptions) *cobra.Command {
	var a actionFlags
	cmd := &cobra.Command{
		Use:   "retry ID...",
		Short: "Retry failed pending messages now instead of at their next attempt (a dry run unless --yes)",
		Long: `Retry moves the next attempt of retrying messages — pending, not leased,
failed at least once — to now, keeping their attempt counts, so that the
next claim takes them: after the target is fixed, there is no need to wait
out the backoff. Each gets a RESCHEDULED attempt in the archive naming the
operator (the OS user unless --operator), the database login and the
--reason, which --yes requires.

All or nothing: a message the database will not retry now (leased, dead —
replay it instead —, delivered) refuses the whole call, naming each, and
exits 1. A paused message is rescheduled but waits for the resume; one
behind its key's head still waits for the head. Without --yes, retry makes
the call and rolls it back: it says what --yes would do, and exits 1 when
--yes would be refused.`,
		Example: `  outboxctl pending list --retrying --namespace billing
  outboxctl retry 0193a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d
  outboxctl retry 0193a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d --yes --reason "INC-4211: billing endpoint fixed"`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("retry needs the ids of the messages to retry (outboxctl pending list --retrying lists them)")
			}
			ids, err := parseIDs("retry", args)
			if err != nil {
				return err
			}
			if err := a.check(); err != nil {
				return err
			}
			return g.withStore(cmd.Context(), func(pool *dbpool.Pool, store *lease.Store) error {
				w := cmd.OutOrStdout()
				if !a.yes {
					return retryDryRun(cmd.Context(), w, pool, ids, a)
				}
				moved, err := store.RetryNow(cmd.Context(), lease.RetryRequest{MessageIDs: ids, Reason: a.reason, Operator: a.operator})
				if err != nil {
					return err
				}
				if a.asJSON {
					return writeJSON(w, moved)
				}
				for _, m := range moved {
					fmt.Fprintf(w, "retrying %s now (its next attempt was in %s), as %s: %s\n",
						m.ID, humanAge(time.Until(m.PreviousAttemptAt)), a.operator, a.reason)
				}
				return nil
			})
		},
	}
	a.register(cmd, "retry them")
	return cmd
}

func newDeadPurgeCommand(g *globalOptions) *cobra.Command {
	var (
		a         actionFlags
		olderThan string
		namespace string
		topic     string
		limit     int
	)
	cmd := &cobra.Command{
		Use:   "purge --older-than 30d",
		Short: "Give up for good on dead letters older than a window (a dry run unless --yes)",
		Long: `Purge removes the dead letters that failed longer ago than --older-than (at
least a day), of a namespace and topic or all, oldest first, at most --limit
per call. Each gets a DISCARDED attempt in the archive naming the operator,
the database login and the --reason, and the purge is in outbox.operator_log
with its counts. A parked ordering key whose dead head goes continues with
its next message. It says how many older letters remain; run it again to
take them. Without --yes it only counts what would go.`,
		Example: `  outboxctl dead purge --older-than 30d
  outboxctl dead purge --older-than 30d --yes --reason "30-day retention of dead letters"
  outboxctl dead purge --older-than 7d --namespace audit --topic login --yes --reason "INC-88: replayed by hand"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan == "" {
				return usagef("dead purge needs --older-than (at least 1d): dead letters younger than that stay")
			}
			age, err := parseAge("--older-than", olderThan)
			if err != nil {
				return err
			}
			if age < 24*time.Hour {
				return usagef("--older-than must be at least 1d (24h), got %s: younger dead letters may not have been looked at yet", olderThan)
			}
			if limit < 1 || limit > 10_000 {
				return usagef("--limit must be between 1 and 10000, got %d", limit)
			}
			if err := a.check(); err != nil {
				return err
			}
			return g.withStore(cmd.Context(), func(_ *dbpool.Pool, store *lease.Store) error {
				w := cmd.OutOrStdout()
				if !a.yes {
					letters, err := store.ListDead(cmd.Context(), lease.DeadFilter{Namespace: namespace, Topic: topic,
						FailedBefore: time.Now().Add(-age), Limit: min(limit, 20)})
					if err != nil {
						return err
					}
					fmt.Fprintf(w, "dry run: %s dead letter%s failed more than %s ago; %s would be purged by this call (add --yes --reason \"…\"):\n",
						count(letters.Matched), plural(letters.Matched), olderThan, count(min(letters.Matched, limit)))
					printDeadLetters(w, letters, time.Now())
					if letters.Matched > len(letters.Letters) {
						fmt.Fprintf(w, "(the oldest %d shown)\n", len(letters.Letters))
					}
					return nil
				}
				res, err := store.PurgeDead(cmd.Context(), lease.PurgeDeadRequest{OlderThan: age, Namespace: namespace, Topic: topic,
					MaxRows: limit, Reason: a.reason, Operator: a.operator})
				if err != nil {
					return err
				}
				if a.asJSON {
					return writeJSON(w, res)
				}
				fmt.Fprintf(w, "purged %s dead letter%s older than %s, as %s: %s\n", count(res.Purged), plural(int(res.Purged)), olderThan, a.operator, a.reason)
				if res.Remaining > 0 {
					fmt.Fprintf(w, "%s older dead letter%s remain: run it again\n", count(res.Remaining), plural(int(res.Remaining)))
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "dead letters that failed longer ago than this (at least 1d: 36h, 7d, 30d)")
	cmd.Flags().StringVar(&namespace, "namespace", "", "only this namespace")
	cmd.Flags().StringVar(&topic, "topic", "", "only this topic")
	cmd.Flags().IntVar(&limit, "limit", 1000, "purge at most this many per call, oldest first")
	a.register(cmd, "purge them")
	return cmd
}

// retryDryRun says what retry --yes would do by doing it in a transaction
// that is rolled back: the database's own rules decide, so the dry run
// cannot promise what the call would refuse. It lists each message as it
// stands, then what would happen; a refusal is returned, as the call
// would return it, marked a dry run.
func retryDryRun(ctx context.Context, w io.Writer, pool *dbpool.Pool, ids []uuid.UUID, a actionFlags) error {
	page, err := lease.NewStore(pool).ListPending(ctx, lease.PendingFilter{MessageIDs: ids, Limit: len(ids)})
	if err != nil {
		return err
	}
	found := map[uuid.UUID]lease.PendingMessage{}
	for _, m := range page.Messages {
		found[m.ID] = m
	}
	var moved []lease.Rescheduled
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The reason and operator are the database's requirements; nothing
		// of this call is kept.
		moved, err = lease.NewStore(tx).RetryNow(ctx, lease.RetryRequest{MessageIDs: ids, Reason: "dry run", Operator: a.operator})
		if err != nil {
			return err
		}
		return errRollback
	})
	if err != nil && !errors.Is(err, errRollback) {
		if r, ok := refusal("retry", err).(refusedError); ok {
			r.dryRun = true
			err = r
		}
		if !a.asJSON { // with --json, the refusal goes to stdout as JSON
			printRetryCandidates(w, ids, found, nil)
		}
		return err
	}
	if a.asJSON {
		return writeJSON(w, struct {
			DryRun bool                `json:"dry_run"`
			Would  []lease.Rescheduled `json:"would_retry"`
		}{true, moved})
	}
	would := map[uuid.UUID]bool{}
	for _, m := range moved {
		would[m.ID] = true
	}
	printRetryCandidates(w, ids, found, would)
	fmt.Fprintln(w, `dry run: nothing changed; add --yes --reason "…" to retry`)
	return nil
}

// errRollback ends a transaction whose work was only to be seen.
var errRollback = errors.New("rolled back")

// printRetryCandidates lists the messages retry names, as they stand, and
// when would is set, which it would retry now.
func printRetryCandidates(w io.Writer, ids []uuid.UUID, found map[uuid.UUID]lease.PendingMessage, would map[uuid.UUID]bool) {
	now := time.Now()
	for _, id := range ids {
		m, ok := found[id]
		line := fmt.Sprintf("%s: not pending (dead, delivered or unknown)", id)
		if ok {
			code := ""
			if m.LastErrorCode != "" {
				code = " (" + m.LastErrorCode + ")"
			}
			line = fmt.Sprintf("%s: %s/%s, %s%s, next attempt %s", id, m.Namespace, m.Topic, m.State, code, nextAttempt(m, now))
		}
		if would[id] {
			line += ": would retry now"
		}
		fmt.Fprintln(w, line)
	}
}
