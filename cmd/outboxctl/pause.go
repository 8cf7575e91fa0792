package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/route"
)

// pauseFlags name what pause and resume act on, and why.
type pauseFlags struct {
	namespace string
	topic     string
	reason    string
	operator  string
	asJSON    bool
	// force pauses a namespace or topic nothing names (pause only).
	force bool
}

func (p *pauseFlags) register(cmd *cobra.Command, verb string) {
	cmd.Flags().StringVar(&p.namespace, "namespace", "", "the namespace to "+verb+" (required)")
	cmd.Flags().StringVar(&p.topic, "topic", "", "only this topic of it (default: the whole namespace)")
	cmd.Flags().StringVar(&p.reason, "reason", "", "why, kept with the pause and in outbox.operator_log (required)")
	cmd.Flags().StringVar(&p.operator, "operator", "", "who acts, recorded with the reason (default: the OS user)")
	cmd.Flags().BoolVar(&p.asJSON, "json", false, "print the result as JSON")
}

func (p *pauseFlags) request(verb string) (lease.PauseRequest, error) {
	if p.namespace == "" {
		return lease.PauseRequest{}, usagef("%s needs --namespace (and --topic for one topic of it)", verb)
	}
	if p.reason == "" {
		return lease.PauseRequest{}, usagef("%s needs a --reason: it is kept in outbox.operator_log", verb)
	}
	if p.operator == "" {
		p.operator = osUser()
	}
	return lease.PauseRequest{Namespace: p.namespace, Topic: p.topic, Reason: p.reason, Operator: p.operator}, nil
}

func (p *pauseFlags) subject() string {
	if p.topic == "" || p.topic == lease.AllTopics {
		return "namespace " + p.namespace
	}
	return p.namespace + "/" + p.topic
}

// pauseResult is pause and resume --json.
type pauseResult struct {
	Namespace string `json:"namespace"`
	Topic     string `json:"topic"`
	Paused    bool   `json:"paused"`
	Messages  int64  `json:"messages"`
}

func newPauseCommand(g *globalOptions) *cobra.Command {
	var p pauseFlags
	cmd := &cobra.Command{
		Use:   "pause --namespace N [--topic T] --reason R",
		Short: "Stop dispatching a namespace, or one topic of it, until resumed",
		Long: `Pause stops every dispatcher from claiming the messages of a namespace, or
of one topic of it: those queued now, and those enqueued or replayed while it
is paused. A message being delivered at that moment finishes its attempt.
Producers go on enqueueing; nothing is lost, and the order of each ordering
key is kept (a key whose next message is paused waits).

outboxctl status shows paused messages apart from due ones, with who paused
them and why, and the metrics export them as PausedMessages (not in the
oldest age, so a pause does not fire OldestPendingAgeAlarm). The pause is in
outbox.operator_log with the operator (the OS user unless --operator), the
database login and the --reason. outboxctl resume undoes it.`,
		Example: `  outboxctl pause --namespace billing --reason "INC-4211: billing endpoint down, stop retrying into it"
  outboxctl pause --namespace payments --topic refund_issued --reason "refunds frozen during the audit"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := p.request("pause")
			if err != nil {
				return err
			}
			return g.withStore(cmd.Context(), func(_ *dbpool.Pool, store *lease.Store) error {
				if !p.force {
					if err := checkPauseSubject(cmd.Context(), store, configuredRoutes(g), p.namespace, p.topic); err != nil {
						return err
					}
				}
				n, err := store.Pause(cmd.Context(), req)
				if err != nil {
					return err
				}
				if p.asJSON {
					return writeJSON(cmd.OutOrStdout(), pauseResult{Namespace: p.namespace, Topic: topicOrAll(p.topic), Paused: true, Messages: n})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "paused %s (%s pending message%s) as %s: %s\nresume with: outboxctl resume --namespace %s%s --reason \"…\"\n",
					p.subject(), count(n), plural(int(n)), p.operator, p.reason, p.namespace, topicFlag(p.topic))
				return nil
			})
		},
	}
	p.register(cmd, "pause")
	cmd.Flags().BoolVar(&p.force, "force", false, "pause a namespace or topic that has no messages and no route yet (what is enqueued later waits)")
	return cmd
}

// checkPauseSubject refuses to pause a namespace, or a topic of it, that
// nothing names: no pending message, no dead letter, no pause, no route
// naming it. Such a pause holds nothing and says so without a word —
// most likely a typo, with the real namespace still flowing — so it is
// refused with the nearest names, and --force pauses it anyway (a
// namespace paused before its producers start). A name that is not a
// namespace at all is left to the database's own refusal.
func checkPauseSubject(ctx context.Context, store *lease.Store, routes *route.Table, namespace, topic string) error {
	if topic == lease.AllTopics {
		topic = ""
	}
	if !outbox.NamePattern.MatchString(namespace) || (topic != "" && !outbox.NamePattern.MatchString(topic)) {
		return nil
	}
	stats, err := store.Stats(ctx)
	if err != nil {
		return err
	}
	pauses, err := store.Pauses(ctx)
	if err != nil {
		return err
	}
	namespaces, topics := map[string]bool{}, map[string]bool{}
	note := func(ns, tp string) {
		namespaces[ns] = true
		if ns == namespace && tp != lease.AllTopics && tp != route.Wildcard {
			topics[tp] = true
		}
	}
	for _, s := range stats {
		note(s.Namespace, s.Topic)
	}
	for _, p := range pauses {
		note(p.Namespace, p.Topic)
	}
	if routes != nil {
		for _, r := range routes.Routes {
			if r.Match.Namespace != route.Wildcard {
				note(r.Match.Namespace, r.Match.Topic)
			} else if r.Match.Topic != route.Wildcard {
				topics[r.Match.Topic] = true // a topic routed in every namespace
			}
		}
	}
	const why = "no pending or dead messages, no pause and no route name it"
	if !namespaces[namespace] {
		return usagef("pause: namespace %q is unknown: %s%s; --force pauses it anyway",
			namespace, why, didYouMean(namespace, slices.Sorted(maps.Keys(namespaces)), "namespace"))
	}
	if topic != "" && !topics[topic] {
		return usagef("pause: topic %q of namespace %s is unknown: %s%s; --force pauses it anyway",
			topic, namespace, why, didYouMean(topic, slices.Sorted(maps.Keys(topics)), "topic"))
	}
	return nil
}

// didYouMean is ": did you mean --namespace billing?" for the names near
// typed, or "" when none is.
func didYouMean(typed string, names []string, flag string) string {
	near := suggest(typed, names)
	if len(near) == 0 {
		return ""
	}
	for i := range near {
		near[i] = "--" + flag + " " + near[i]
	}
	return " (did you mean " + orList(near) + "?)"
}

// configuredRoutes are the routes of the environment (OUTBOX_ROUTES, a
// routes file or an SSM parameter), nil when none is configured or it
// does not load: they only help recognise a namespace.
func configuredRoutes(g *globalOptions) *route.Table {
	cfg, err := dispatchconfig.Load(g.env())
	if err != nil {
		return nil
	}
	return cfg.Routes
}

func newResumeCommand(g *globalOptions) *cobra.Command {
	var p pauseFlags
	cmd := &cobra.Command{
		Use:   "resume --namespace N [--topic T] --reason R",
		Short: "Dispatch a paused namespace or topic again",
		Long: `Resume ends a pause made by outboxctl pause — the same --namespace and
--topic — and its messages are claimable again, in their old order. A
message still under another pause (its topic paused on its own) stays
paused. The resume is in outbox.operator_log with who had paused it, when
and why.`,
		Example: `  outboxctl status        # lists what is paused, by whom and why
  outboxctl resume --namespace billing --reason "INC-4211: endpoint fixed"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := p.request("resume")
			if err != nil {
				return err
			}
			return g.withStore(cmd.Context(), func(_ *dbpool.Pool, store *lease.Store) error {
				n, err := store.Resume(cmd.Context(), req)
				if err != nil {
					return err
				}
				if p.asJSON {
					return writeJSON(cmd.OutOrStdout(), pauseResult{Namespace: p.namespace, Topic: topicOrAll(p.topic), Paused: false, Messages: n})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "resumed %s (%s pending message%s claimable again) as %s: %s\n",
					p.subject(), count(n), plural(int(n)), p.operator, p.reason)
				return nil
			})
		},
	}
	p.register(cmd, "resume")
	return cmd
}

func topicOrAll(topic string) string {
	if topic == "" {
		return lease.AllTopics
	}
	return topic
}

func topicFlag(topic string) string {
	if topic == "" || topic == lease.AllTopics {
		return ""
	}
	return " --topic " + topic
}

// printPauses lists the pauses in force, for status.
func printPauses(w io.Writer, pauses []lease.Pause, now time.Time) {
	if len(pauses) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%d pause%s in force (outboxctl resume --namespace N [--topic T] --reason \"…\"):\n", len(pauses), plural(len(pauses)))
	tw := table(w)
	fmt.Fprintln(tw, "NAMESPACE/TOPIC\tMESSAGES\tPAUSED BY\tLOGIN\tSINCE\tREASON")
	for _, p := range pauses {
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s ago\t%s\n", p.Namespace, p.Topic, count(p.Messages), orDash(p.PausedBy),
			p.DBUser, humanAge(now.Sub(p.PausedAt)), truncate(p.Reason, 60))
	}
	tw.Flush()
}
