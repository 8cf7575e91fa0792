package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/handler/replayfn"
	"github.com/outboxkit/dispatcher/shared/lease"
)

// listMaxLimit caps `dead list --limit`: the most outbox.replay_dead takes
// at once, so that a listing can always show what a replay would move.
const listMaxLimit = config.MaxReplayLimit

func newDeadCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead list|show|purge",
		Short: "List dead letters, show one with its payload and attempt history, or purge old ones",
		Long: `Dead letters are messages that will not be delivered as they are: a target
refused them (TARGET_REJECTED, INVALID_PAYLOAD, …), no route matched
(NO_ROUTE), or their retries ran out. They wait in outbox.dead until an
operator replays them (outboxctl replay) once the cause is fixed, discards
them (outboxctl discard), or purges those older than a window (dead purge).`,
		Example: `  outboxctl dead list
  outboxctl dead list --namespace billing --error-code TARGET_REJECTED --failed-after 24h
  outboxctl dead show 0193a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d
  outboxctl dead list --json | jq -r '.dead_letters[].id'
  outboxctl dead purge --older-than 30d --yes --reason "30-day retention"`,
	}
	cmd.AddCommand(newDeadListCommand(g), newDeadShowCommand(g), newDeadPurgeCommand(g))
	return cmd
}

func newDeadListCommand(g *globalOptions) *cobra.Command {
	var (
		filter deadFilterFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest failure first (the order replay takes them)",
		Example: `  outboxctl dead list
  outboxctl dead list --topic usage_snapshot --limit 20
  outboxctl dead list --failed-after 2026-11-20 --failed-before 2026-11-21`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ev, err := filter.event(time.Now())
			if err != nil {
				return err
			}
			// Listing everything is harmless, unlike replaying it.
			ev.All = true
			req, err := parseReplayFlags(ev, listMaxLimit)
			if err != nil {
				return err
			}
			return list(cmd, g, asJSON, func(store *lease.Store) (lease.DeadLetters, error) {
				return store.ListDead(cmd.Context(), req.Filter())
			}, printDeadLetters)
		},
	}
	filter.register(cmd.Flags(), fmt.Sprintf("list at most this many (default %d, at most %d)", replayfn.DefaultLimit, listMaxLimit))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// shownMessage is dead show --json: the message (null once it has left
// the outbox) and every recorded attempt.
type shownMessage struct {
	Message  *lease.StoredMessage `json:"message"`
	Attempts []lease.Attempt      `json:"attempts"`
}

// printDeadLetters is the dead-letter table of `dead list`, `replay` and
// the demo.
func printDeadLetters(w io.Writer, letters lease.DeadLetters, now time.Time) {
	if len(letters.Letters) == 0 {
		fmt.Fprintln(w, "no dead letters match")
		return
	}
	tw := table(w)
	fmt.Fprintln(tw, "ID\tNAMESPACE/TOPIC\tCODE\tERROR\tATTEMPTS\tFAILED")
	for _, d := range letters.Letters {
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\t%d\t%s ago\n", d.ID, d.Namespace, d.Topic, orDash(d.LastErrorCode),
			orDash(truncate(d.LastError, 80)), d.AttemptCount, humanAge(now.Sub(d.FailedAt)))
	}
	tw.Flush()
	if letters.Matched > len(letters.Letters) {
		fmt.Fprintf(w, "showing the oldest %s of %s matching dead letters (raise --limit to see more)\n", count(len(letters.Letters)), count(letters.Matched))
	}
}

func newDeadShowCommand(g *globalOptions) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a message: its keys, headers, payload and every recorded attempt",
		Long: `Show a dead letter — or a pending message, or the attempt history of one
already delivered — with its keys, headers, payload and every outcome
recorded in outbox.attempts, oldest first (replays included, with their
operator and reason).

ID is the message's id, or a prefix of it of at least 8 hex digits that
one message alone begins with; an ambiguous prefix is refused, listing the
messages it matches.`,
		Example: `  outboxctl dead show 0193a3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d
  outboxctl dead show 0193a3c4-5e6f --json`,
		Args: exactArgs(1, "a message id (outboxctl dead list shows them)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			lo, hi, err := parseIDPrefix(args[0])
			if err != nil {
				return err
			}
			return g.withStore(cmd.Context(), func(_ *dbpool.Pool, store *lease.Store) error {
				id := lo
				if lo != hi {
					if id, err = resolveIDPrefix(cmd.Context(), store, args[0], lo, hi); err != nil {
						return err
					}
				}
				msg, err := store.LookupMessage(cmd.Context(), id)
				found := err == nil
				if err != nil && !errors.Is(err, lease.ErrMessageNotFound) {
					return err
				}
				attempts, err := store.MessageAttempts(cmd.Context(), id)
				if err != nil {
					return err
				}
				if !found && len(attempts) == 0 {
					return fmt.Errorf("no message %s: not pending, not dead, and no attempts recorded (delivered before the attempts retention, or never enqueued)", id)
				}
				if asJSON {
					doc := shownMessage{Attempts: attempts}
					if found {
						doc.Message = &msg
					}
					return writeJSON(cmd.OutOrStdout(), doc)
				}
				w := cmd.OutOrStdout()
				if found {
					printMessage(w, msg, time.Now())
				} else {
					fmt.Fprintf(w, "message %s has left the outbox (delivered, or dead and purged); its recorded attempts:\n", id)
				}
				fmt.Fprintln(w)
				printAttempts(w, attempts)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printMessage(w io.Writer, m lease.StoredMessage, now time.Time) {
	switch {
	case m.State == lease.StateDead && m.FailedAt != nil:
		fmt.Fprintf(w, "message %s  DEAD since %s (%s ago)\n", m.ID, m.FailedAt.UTC().Format(time.RFC3339), humanAge(now.Sub(*m.FailedAt)))
	case m.ClaimedBy != "":
		fmt.Fprintf(w, "message %s  PENDING, leased by %s\n", m.ID, m.ClaimedBy)
	default:
		fmt.Fprintf(w, "message %s  PENDING\n", m.ID)
	}
	tw := table(w)
	row := func(k, v string) { fmt.Fprintf(tw, "  %s\t%s\n", k, v) }
	row("namespace/topic", m.Namespace+"/"+m.Topic)
	row("tenant", orDash(m.TenantID))
	row("dedupe key", orDash(m.DedupeKey))
	ordering := orDash(m.OrderingKey)
	if m.OrderingKey != "" {
		ordering = fmt.Sprintf("%s (sequence %d)", m.OrderingKey, m.SequenceID)
	}
	row("ordering key", ordering)
	row("created", fmt.Sprintf("%s (%s ago)", m.CreatedAt.UTC().Format(time.RFC3339), humanAge(now.Sub(m.CreatedAt))))
	row("attempts", fmt.Sprint(m.AttemptCount))
	if m.State == lease.StatePending && m.NextAttemptAt != nil && m.ClaimedBy == "" {
		when := "due now"
		if d := m.NextAttemptAt.Sub(now); d > 0 {
			when = "due in " + humanAge(d)
		}
		row("next attempt", when)
	}
	if m.LeaseExpiresAt != nil {
		row("lease expires", m.LeaseExpiresAt.UTC().Format(time.RFC3339))
	}
	if m.LastErrorCode != "" || m.LastError != "" {
		row("last error", strings.TrimSpace(orDash(m.LastErrorCode)+": "+m.LastError))
	}
	if m.TraceHeader != "" {
		row("trace header", m.TraceHeader)
	}
	if m.FailedBy != "" {
		row("failed by", m.FailedBy)
	}
	tw.Flush()
	fmt.Fprintln(w, "  headers")
	if len(m.Headers) == 0 {
		fmt.Fprintln(w, "    (none)")
	}
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(w, "    %s: %s\n", k, m.Headers[k])
	}
	fmt.Fprintln(w, "  payload")
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, m.Payload, "    ", "  "); err != nil {
		pretty.Reset()
		pretty.Write(m.Payload)
	}
	fmt.Fprintf(w, "    %s\n", pretty.String())
}

func printAttempts(w io.Writer, attempts []lease.Attempt) {
	if len(attempts) == 0 {
		fmt.Fprintln(w, "no attempts recorded")
		return
	}
	fmt.Fprintf(w, "attempts (%d, oldest first)\n", len(attempts))
	tw := table(w)
	fmt.Fprintln(tw, "  #\tSTATE\tAT\tBY\tTARGET\tREF\tCODE\tLATENCY\tDETAIL")
	for _, a := range attempts {
		latency := "-"
		if a.LatencyMS != nil {
			latency = fmt.Sprintf("%dms", *a.LatencyMS)
		}
		by := a.WorkerID
		detail := a.ErrorMessage
		// An operator's action (REPLAYED, DISCARDED, RESCHEDULED): who and why.
		if a.Operator != "" || a.State == "REPLAYED" {
			by = a.Operator
			detail = "reason: " + orDash(a.Reason)
			if a.Note != "" {
				detail += " (" + a.Note + ")"
			}
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.AttemptNo, a.State,
			a.CreatedAt.UTC().Format("2006-01-02 15:04:05.000"), orDash(by), orDash(a.Target), orDash(a.TargetRef),
			orDash(a.ErrorCode), latency, orDash(strings.Join(strings.Fields(detail), " ")))
	}
	tw.Flush()
}

// minIDPrefix is the shortest prefix of an id dead show takes: 8 hex
// digits, what the first group of a UUID shows.
const minIDPrefix = 8

// parseIDPrefix reads a message id or a prefix of one (hyphens anywhere,
// any case) as the range of ids it covers: lo == hi for a whole id.
func parseIDPrefix(s string) (lo, hi uuid.UUID, err error) {
	if id, err := uuid.Parse(s); err == nil {
		return id, id, nil
	}
	digits := strings.ToLower(strings.ReplaceAll(s, "-", ""))
	_, hexErr := hex.DecodeString(digits + strings.Repeat("0", len(digits)%2))
	if hexErr != nil || len(digits) == 0 || len(digits) > 32 {
		return uuid.UUID{}, uuid.UUID{}, usagef("%q is not a message id (a UUID) nor a prefix of one", s)
	}
	if len(digits) < minIDPrefix {
		return uuid.UUID{}, uuid.UUID{}, usagef("%q is too short a prefix of a message id: give at least %d hex digits", s, minIDPrefix)
	}
	lo = uuid.MustParse(digits + strings.Repeat("0", 32-len(digits)))
	hi = uuid.MustParse(digits + strings.Repeat("f", 32-len(digits)))
	return lo, hi, nil
}

// maxCandidates is how many messages an ambiguous prefix lists.
const maxCandidates = 10

// resolveIDPrefix is the one message whose id begins with prefix (the
// range lo-hi); none, or more than one, is an error naming them.
func resolveIDPrefix(ctx context.Context, store *lease.Store, prefix string, lo, hi uuid.UUID) (uuid.UUID, error) {
	ids, err := store.MessageIDsBetween(ctx, lo, hi, maxCandidates+1)
	if err != nil {
		return uuid.UUID{}, err
	}
	switch {
	case len(ids) == 1:
		return ids[0], nil
	case len(ids) == 0:
		return uuid.UUID{}, fmt.Errorf("no message id begins with %s: none pending, dead or with recorded attempts", prefix)
	}
	names := make([]string, min(len(ids), maxCandidates))
	for i := range names {
		names[i] = ids[i].String()
	}
	matches := fmt.Sprintf("%d messages", len(ids))
	if len(ids) > maxCandidates {
		matches = fmt.Sprintf("more than %d messages, the first", maxCandidates)
	}
	return uuid.UUID{}, usagef("prefix %s is ambiguous: it matches %s: %s; give more of the id", prefix, matches, strings.Join(names, ", "))
}
