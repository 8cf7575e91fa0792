package main

import (
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
)

func newBlockedCommand(g *globalOptions) *cobra.Command {
	var (
		namespace string
		limit     int
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "blocked",
		Short: "List ordering keys that cannot move: their head, since when and why",
		Long: `An ordering key delivers its messages one after another, so a head that
cannot go holds every message behind it. blocked lists those keys, longest
blocked first:

  retrying       the head failed and waits for its next attempt (since its
                 first failure); its error says why
  lease_expired  the head's dispatcher died or stalled holding it; the reaper
                 or the next claim requeues it
  parked         the head died under a route with on_dead: park; the key
                 waits until it is replayed (outboxctl replay --id …) or
                 discarded (outboxctl discard …)
  unsettled      a dispatcher could not hand the key its next head while a
                 producer was committing to it; the next claim does

WAITING counts the messages queued behind the head.`,
		Example: `  outboxctl blocked
  outboxctl blocked --namespace payments --limit 20
  outboxctl blocked --json | jq -r '.[] | select(.state == "parked") | .message_id'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > 10_000 {
				return usagef("--limit must be between 1 and 10000, got %d", limit)
			}
			return list(cmd, g, asJSON, func(store *lease.Store) ([]lease.BlockedKey, error) {
				keys, err := store.BlockedKeys(cmd.Context(), namespace, limit)
				if keys == nil {
					keys = []lease.BlockedKey{} // [] in JSON, not null
				}
				return keys, err
			}, printBlockedKeys)
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "only keys of this namespace")
	cmd.Flags().IntVar(&limit, "limit", 100, "list at most this many")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printBlockedKeys(w io.Writer, keys []lease.BlockedKey, now time.Time) {
	if len(keys) == 0 {
		fmt.Fprintln(w, "no blocked ordering keys")
		return
	}
	tw := table(w)
	fmt.Fprintln(tw, "NAMESPACE/KEY\tSTATE\tSINCE\tHEAD\tSEQ\tATTEMPTS\tCODE\tERROR\tWAITING")
	for _, k := range keys {
		head, seq := "-", "-"
		if k.MessageID != uuid.Nil {
			head, seq = k.MessageID.String(), fmt.Sprint(k.SequenceID)
		}
		fmt.Fprintf(tw, "%s/%s\t%s\t%s ago\t%s\t%s\t%d\t%s\t%s\t%s\n",
			k.Namespace, truncate(k.OrderingKey, 40), k.State, humanAge(now.Sub(k.Since)), head, seq,
			k.AttemptCount, orDash(k.ErrorCode), orDash(truncate(k.Error, 60)), count(k.Waiting))
	}
	tw.Flush()
}

func newDiscardCommand(g *globalOptions) *cobra.Command {
	var (
		yes      bool
		reason   string
		operator string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "discard ID...",
		Short: "Give up on messages for good: dead letters, or pending ones no dispatcher holds",
		Long: `Discard removes messages for good, each with a DISCARDED attempt in the
archive naming the operator (the OS user unless --operator), the database
login and the --reason. It takes dead letters, and pending messages no
dispatcher holds right now (a message being delivered is left alone: try
again when its attempt is over).

A parked ordering key whose dead head is discarded goes on with its next
message. Without --yes, discard only says what it would remove.`,
		Example: `  outboxctl discard 0193a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d
  outboxctl discard 0193a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d --yes --reason "refund 991 was issued by hand"`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("discard needs the ids of the messages to discard")
			}
			ids := make([]uuid.UUID, len(args))
			for i, a := range args {
				id, err := uuid.Parse(a)
				if err != nil {
					return usagef("%q is not a message id", a)
				}
				ids[i] = id
			}
			if yes && reason == "" {
				return usagef("--yes needs a --reason: it is kept in the attempts archive")
			}
			return g.withStore(cmd.Context(), func(_ *dbpool.Pool, store *lease.Store) error {
				w := cmd.OutOrStdout()
				if !yes {
					for _, id := range ids {
						m, err := store.LookupMessage(cmd.Context(), id)
						if err != nil {
							fmt.Fprintf(w, "%s: %v\n", id, err)
							continue
						}
						fmt.Fprintf(w, "%s: %s %s/%s%s would be discarded\n", id, m.State, m.Namespace, m.Topic, keyNote(m))
					}
					fmt.Fprintln(w, `dry run: add --yes --reason "…" to discard`)
					return nil
				}
				if operator == "" {
					operator = osUser()
				}
				gone, err := store.Discard(cmd.Context(), lease.DiscardRequest{MessageIDs: ids, Reason: reason, Operator: operator})
				if err != nil {
					return err
				}
				if asJSON {
					if gone == nil {
						gone = []lease.Discarded{}
					}
					return writeJSON(w, gone)
				}
				for _, d := range gone {
					fmt.Fprintf(w, "discarded %s (%s) as %s: %s\n", d.ID, d.From, operator, reason)
				}
				if missed := len(ids) - len(gone); missed > 0 {
					fmt.Fprintf(w, "%s not discarded: unknown, already gone, or leased right now\n", count(missed))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "discard (default: a dry run that only says what would go)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept on each DISCARDED attempt (required with --yes)")
	cmd.Flags().StringVar(&operator, "operator", "", "who discards, recorded with the reason (default: the OS user)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was discarded as JSON")
	return cmd
}

// keyNote says where an ordered message stands in its key.
func keyNote(m lease.StoredMessage) string {
	switch {
	case m.OrderingKey == "":
		return ""
	case m.HoldsKey:
		return fmt.Sprintf(" (sequence %d of key %s, which waits for it)", m.SequenceID, m.OrderingKey)
	default:
		return fmt.Sprintf(" (sequence %d of key %s)", m.SequenceID, m.OrderingKey)
	}
}
