package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/outbox"
)

// messageFields are the fields of a JSON line, named as the flags.
var messageFields = []string{"namespace", "topic", "payload", "tenant", "dedupe-key", "ordering-key", "header", "available-at"}

// messageLine is one message on stdin: the flags as JSON fields.
type messageLine struct {
	Namespace   string            `json:"namespace"`
	Topic       string            `json:"topic"`
	Payload     json.RawMessage   `json:"payload"`
	Tenant      string            `json:"tenant"`
	DedupeKey   string            `json:"dedupe-key"`
	OrderingKey string            `json:"ordering-key"`
	Header      map[string]string `json:"header"`
	AvailableAt string            `json:"available-at"`
}

// outboxFieldFlags names outbox.ValidationError's fields as flags.
var outboxFieldFlags = map[string]string{
	"tenant_id": "tenant", "dedupe_key": "dedupe-key", "ordering_key": "ordering-key", "headers": "header",
}

// enqueueFlags are one message given on the command line.
type enqueueFlags struct {
	namespace, topic, payload, tenant, dedupeKey, orderingKey, availableAt string
	headers                                                                []string
}

func newEnqueueCommand(g *globalOptions) *cobra.Command {
	var (
		flags  enqueueFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "enqueue",
		Short: "Enqueue messages from flags, or JSON lines on stdin, in one transaction",
		Long: `Enqueue one message from flags, or many from JSON lines on stdin: one message
object per line, its fields named as the flags (namespace, topic, payload,
tenant, dedupe-key, ordering-key, header, available-at). Every line is read
and validated before anything is written, and all are written in one
transaction: a bad line fails the whole input, naming its line number.

For each message it prints the id, the sequence id (with an ordering key)
and whether it was inserted: a message whose dedupe key is already in the
outbox is not inserted again, and the first message's id is printed.`,
		Example: `  outboxctl enqueue --namespace billing --topic usage_snapshot \
      --payload '{"tenant":"t-42","tokens":1200}' --tenant t-42 --dedupe-key t-42/turn-7/req-1
  outboxctl enqueue --namespace billing --topic invoice --payload @invoice.json \
      --ordering-key billing:t-42 --header trace-tag=manual --available-at 10m
  printf '%s\n' \
      '{"namespace":"billing","topic":"usage_snapshot","payload":{"tokens":1},"dedupe-key":"k1"}' \
      '{"namespace":"billing","topic":"usage_snapshot","payload":{"tokens":2},"dedupe-key":"k2","header":{"region":"eu"}}' \
      | outboxctl enqueue`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			fromFlags := false
			for _, name := range messageFields {
				fromFlags = fromFlags || cmd.Flags().Changed(name)
			}
			var (
				msgs  []outbox.Message
				where func(i int) string
				err   error
			)
			if fromFlags {
				var msg outbox.Message
				msg, err = flags.message(now)
				msgs = []outbox.Message{msg}
				where = func(int) string { return "" }
			} else {
				in := cmd.InOrStdin()
				if isTerminal(in) {
					return usagef("give a message with --namespace, --topic and --payload, or pipe JSON lines on stdin (see outboxctl enqueue --help)")
				}
				var lines []int
				msgs, lines, err = readMessageLines(in, now)
				where = func(i int) string { return fmt.Sprintf("line %d: ", lines[i]) }
			}
			if err != nil {
				return err
			}
			return g.withStore(cmd.Context(), func(pool *dbpool.Pool, _ *lease.Store) error {
				results, err := enqueueInOneTransaction(cmd.Context(), pool, msgs, where)
				if err != nil {
					return err
				}
				return printEnqueued(cmd.OutOrStdout(), results, asJSON)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&flags.namespace, "namespace", "", "the message's namespace (required)")
	f.StringVar(&flags.topic, "topic", "", "the message's topic (required)")
	f.StringVar(&flags.payload, "payload", "", "the payload: a JSON object or array, or @FILE to read one (required)")
	f.StringVar(&flags.tenant, "tenant", "", "the tenant id carried to the target")
	f.StringVar(&flags.dedupeKey, "dedupe-key", "", "idempotency key: enqueued once per namespace/topic, and the key receivers deduplicate on")
	f.StringVar(&flags.orderingKey, "ordering-key", "", "deliver this key's messages one at a time, in enqueue order")
	f.StringArrayVar(&flags.headers, "header", nil, "a header NAME=VALUE delivered with the message (repeatable)")
	f.StringVar(&flags.availableAt, "available-at", "", "deliver no earlier than this: an RFC 3339 time, or a duration from now (10m)")
	f.BoolVar(&asJSON, "json", false, "print one JSON line per message")
	return cmd
}

func (f enqueueFlags) message(now time.Time) (outbox.Message, error) {
	for _, required := range []struct{ flag, value string }{{"--namespace", f.namespace}, {"--topic", f.topic}, {"--payload", f.payload}} {
		if required.value == "" {
			return outbox.Message{}, usagef("%s is required (or pipe JSON lines on stdin)", required.flag)
		}
	}
	payload := []byte(f.payload)
	if path, ok := strings.CutPrefix(f.payload, "@"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return outbox.Message{}, usagef("--payload @%s: %v", path, cause(err))
		}
		payload = bytes.TrimSpace(b)
	}
	if !json.Valid(payload) {
		return outbox.Message{}, usagef("--payload is not valid JSON")
	}
	headers := map[string]string{}
	for _, h := range f.headers {
		name, value, ok := strings.Cut(h, "=")
		if !ok || name == "" {
			return outbox.Message{}, usagef("--header wants NAME=VALUE, got %q", h)
		}
		headers[name] = value
	}
	msg := outbox.Message{
		Namespace: f.namespace, Topic: f.topic, Payload: payload, TenantID: f.tenant,
		DedupeKey: f.dedupeKey, OrderingKey: f.orderingKey, Headers: headers,
	}
	if f.availableAt != "" {
		at, err := parseWhen("--available-at", f.availableAt, now, true)
		if err != nil {
			return outbox.Message{}, err
		}
		msg.AvailableAt = at
	}
	return msg, nil
}

// maxLineBytes bounds one JSON line: the largest payload outbox.limits
// may allow (10 MiB), with room for the rest and for escaping.
const maxLineBytes = 24 << 20

// readMessageLines reads every line before anything is written, so that a
// bad line fails the whole input. It returns each message's line number.
func readMessageLines(in io.Reader, now time.Time) ([]outbox.Message, []int, error) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	var (
		msgs  []outbox.Message
		lines []int
	)
	for n := 1; sc.Scan(); n++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var l messageLine
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return nil, nil, usagef("line %d: %s", n, describeLineError(err))
		}
		if dec.More() {
			return nil, nil, usagef("line %d: more than one JSON value: one message object per line", n)
		}
		f := enqueueFlags{namespace: l.Namespace, topic: l.Topic, payload: string(l.Payload), tenant: l.Tenant,
			dedupeKey: l.DedupeKey, orderingKey: l.OrderingKey, availableAt: l.AvailableAt}
		if strings.HasPrefix(f.payload, "@") {
			return nil, nil, usagef("line %d: payload must be a JSON object or array (@FILE works only with --payload)", n)
		}
		for name, value := range l.Header {
			f.headers = append(f.headers, name+"="+value)
		}
		sort.Strings(f.headers)
		msg, err := f.message(now)
		if err != nil {
			// The flags' wording, for fields: "--topic is required" reads
			// as "topic is required" on a line.
			problem := strings.Replace(err.Error(), " (or pipe JSON lines on stdin)", "", 1)
			return nil, nil, usagef("line %d: %s", n, strings.Replace(problem, "--", "", 1))
		}
		msgs = append(msgs, msg)
		lines = append(lines, n)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, nil, usagef("line %d: longer than %d bytes", len(lines)+1, maxLineBytes)
		}
		return nil, nil, fmt.Errorf("read stdin: %w", err)
	}
	if len(msgs) == 0 {
		return nil, nil, usagef("no messages on stdin: one JSON object per line, fields named as the flags (%s)", strings.Join(messageFields, ", "))
	}
	return msgs, lines, nil
}

func describeLineError(err error) string {
	var syntax *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return "not valid JSON: " + syntax.Error()
	case errors.As(err, &typeErr):
		return fmt.Sprintf("field %q must be %s, got a JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Sprintf("%s; the fields are named as the flags: %s",
			strings.TrimPrefix(err.Error(), "json: "), strings.Join(messageFields, ", "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "not valid JSON: unexpected end of line"
	}
	return "not valid JSON: " + err.Error()
}

// enqueueInOneTransaction writes every message, in batches, in one
// transaction: all or nothing. where(i) names message i in errors. The
// messages are held to the database's limits (outbox.limits), which every
// producer is held to, not to the Go producer's defaults: an operator who
// raised max_payload_bytes can enqueue what the database now takes.
func enqueueInOneTransaction(ctx context.Context, pool *dbpool.Pool, msgs []outbox.Message, where func(int) string) ([]outbox.Enqueued, error) {
	producer := outbox.Producer{Limits: databaseLimits(ctx, pool)}
	var results []outbox.Enqueued
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for from := 0; from < len(msgs); from += outbox.DefaultLimits.MaxBatch {
			to := min(from+outbox.DefaultLimits.MaxBatch, len(msgs))
			batch, err := producer.EnqueueBatch(ctx, tx, msgs[from:to])
			var invalid *outbox.ValidationError
			if errors.As(err, &invalid) {
				field := invalid.Field
				if flag, ok := outboxFieldFlags[field]; ok {
					field = flag
				}
				i := from
				if invalid.Index >= 0 {
					i += invalid.Index
				}
				return usagef("%s%s %s", where(i), field, invalid.Reason)
			}
			if err != nil {
				return err
			}
			results = append(results, batch...)
		}
		return nil
	})
	return results, err
}

// enqueued is one line of enqueue --json.
type enqueued struct {
	MessageID  string `json:"message_id"`
	SequenceID *int64 `json:"sequence_id"`
	Inserted   bool   `json:"inserted"`
}

func printEnqueued(w io.Writer, results []outbox.Enqueued, asJSON bool) error {
	if asJSON {
		for _, r := range results {
			e := enqueued{MessageID: r.ID.String(), Inserted: r.Inserted}
			if r.SequenceID != 0 {
				seq := r.SequenceID
				e.SequenceID = &seq
			}
			if err := writeJSONLine(w, e); err != nil {
				return err
			}
		}
		return nil
	}
	tw := table(w)
	fmt.Fprintln(tw, "ID\tSEQUENCE\tINSERTED")
	inserted := 0
	for _, r := range results {
		seq, what := "-", "yes"
		if r.SequenceID != 0 {
			seq = fmt.Sprint(r.SequenceID)
		}
		if r.Inserted {
			inserted++
		} else {
			what = "no: dedupe key already enqueued, this is the first message's id"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.ID, seq, what)
	}
	tw.Flush()
	if len(results) > 1 {
		fmt.Fprintf(w, "%s enqueued, %s duplicate%s suppressed\n", count(inserted), count(len(results)-inserted), plural(len(results)-inserted))
	}
	return nil
}

// databaseLimits reads outbox.limits. A login that may not read them (a
// producer's: the table is the operators' and readers') gets the widest
// limits the table allows instead, so that outbox.enqueue, which holds
// every message to them, is the judge (its refusal names the field too).
func databaseLimits(ctx context.Context, pool *dbpool.Pool) outbox.Limits {
	l, err := outbox.LoadLimits(ctx, pool)
	if err != nil {
		// Unread, the bounds of outbox.limits' CHECK constraints: the
		// database then refuses what it does not take, as it should.
		return outbox.Limits{MaxPayloadBytes: 10 << 20, MaxKeyBytes: 4096, MaxHeaders: 64,
			MaxHeaderValueBytes: 65536, MaxDelay: 100 * 365 * 24 * time.Hour}
	}
	return l
}
