package main

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/replayfn"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// deadFilterFlags are the dead-letter replay function's filters as flags,
// shared by `dead list` and `replay`. They are validated by the function's
// own parser (replayfn.ParseEvent), so the command line accepts and
// refuses exactly what the function does.
type deadFilterFlags struct {
	ids          []string
	namespace    string
	topic        string
	errorCode    string
	failedAfter  string
	failedBefore string
	limit        int
}

func (f *deadFilterFlags) register(fs *pflag.FlagSet, limitUsage string) {
	fs.StringArrayVar(&f.ids, "id", nil, "a dead letter's message id (repeatable)")
	fs.StringVar(&f.namespace, "namespace", "", "only this namespace")
	fs.StringVar(&f.topic, "topic", "", "only this topic")
	fs.StringVar(&f.errorCode, "error-code", "", "only this last error code (TARGET_REJECTED, NO_ROUTE, …)")
	fs.StringVar(&f.failedAfter, "failed-after", "", "only letters that failed at or after this time (RFC 3339, a date, or a duration ago: 24h)")
	fs.StringVar(&f.failedBefore, "failed-before", "", "only letters that failed before this time (same forms)")
	fs.IntVar(&f.limit, "limit", 0, limitUsage)
}

// event is the replay function's event for these filters.
func (f *deadFilterFlags) event(now time.Time) (replayfn.Event, error) {
	if err := checkErrorCode(f.errorCode); err != nil {
		return replayfn.Event{}, err
	}
	ev := replayfn.Event{
		MessageIDs: f.ids, Namespace: f.namespace, Topic: f.topic, ErrorCode: f.errorCode, Limit: f.limit,
	}
	for _, tf := range []struct {
		flag, value string
		into        **time.Time
	}{{"--failed-after", f.failedAfter, &ev.FailedAfter}, {"--failed-before", f.failedBefore, &ev.FailedBefore}} {
		if tf.value == "" {
			continue
		}
		t, err := parseWhen(tf.flag, tf.value, now, false)
		if err != nil {
			return ev, err
		}
		*tf.into = &t
	}
	return ev, nil
}

// checkErrorCode refuses an --error-code that no dispatcher records: a
// typo would otherwise match no dead letter, and a dry run would say there
// is nothing to replay while the letters wait.
func checkErrorCode(code string) error {
	if code == "" {
		return nil
	}
	names := make([]string, len(outboxtype.Codes))
	for i, c := range outboxtype.Codes {
		if string(c) == code {
			return nil
		}
		names[i] = string(c)
	}
	if near := suggest(code, names); len(near) > 0 {
		return usagef("--error-code %q is not an error code: did you mean %s? (the codes: %s)", code, orList(near), strings.Join(names, ", "))
	}
	return usagef("--error-code %q is not an error code: use one of %s", code, strings.Join(names, ", "))
}

// parseReplayFlags validates ev with replayfn.ParseEvent, the function's own
// validation, and words its complaints in flags.
func parseReplayFlags(ev replayfn.Event, maxLimit int) (lease.ReplayRequest, error) {
	raw, err := json.Marshal(ev)
	if err != nil {
		return lease.ReplayRequest{}, err
	}
	req, err := replayfn.ParseEvent(raw, maxLimit)
	var evErr *handler.EventError
	if errors.As(err, &evErr) {
		return req, usagef("%s", inFlagTerms(evErr.Problem))
	}
	return req, err
}

// flagTerms rewrites the replay event's field names, as the function's
// messages use them, into this command's flags.
var flagTerms = strings.NewReplacer(
	// Comparisons go in argument order: the longest phrases first.
	`set message_ids, namespace, topic,`, `set --id, --namespace, --topic,`,
	`message_ids`, `--id`,
	`namespace: `, `--namespace: `,
	`topic: `, `--topic: `,
	`error_code`, `--error-code`,
	`failed_after`, `--failed-after`,
	`failed_before`, `--failed-before`,
	`"all": true`, `--all`,
	`("dry_run": false)`, `(--yes)`,
	`needs a reason`, `needs a --reason`,
	`limit must`, `--limit must`,
)

func inFlagTerms(problem string) string { return flagTerms.Replace(problem) }
