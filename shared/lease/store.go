package lease

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	producerheaders "github.com/outboxkit/dispatcher/shared/outbox/headers"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// Querier runs queries: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is the dispatcher side of the outbox: every method is one call to
// one outbox function, so one database round trip.
type Store struct {
	db Querier
	// AttemptCeiling overrides outboxtype.DefaultAttemptCeiling when
	// positive.
	AttemptCeiling int
}

// NewStore returns a store on db.
func NewStore(db Querier) *Store { return &Store{db: db} }

func (s *Store) ceiling() int {
	if s.AttemptCeiling > 0 {
		return s.AttemptCeiling
	}
	return outboxtype.DefaultAttemptCeiling
}

// ClaimParams say what to claim and for how long.
type ClaimParams struct {
	// WorkerID names the claimer; only it can complete what it claims.
	WorkerID string
	// BatchSize is the most messages to claim (1-10,000).
	BatchSize int
	// Lease is how long the claim holds; it must outlast the work, or the
	// reaper hands the messages to someone else and this worker's
	// completions come back lease_lost. Rounded up to whole seconds.
	Lease time.Duration
	// Namespaces restricts the claim to these namespaces (nil: all).
	Namespaces []string
	// MaxRun is the most messages of one ordering key a claim takes: the
	// key's head and up to MaxRun-1 of the messages queued behind it, in
	// sequence order (0 or 1: the head alone).
	MaxRun int
	// MaxBytes bounds the claim's payloads, in bytes of their JSON (0: no
	// bound): the claim stops before it would exceed it, but always takes
	// at least one message. It is the dispatcher's memory budget per batch.
	MaxBytes int64
	// MaxPayloadBytes is the largest payload any route may send (0: no
	// limit): a larger one is claimed without its payload (see
	// [outboxtype.Message.PayloadOmitted]), so that it is dead-lettered without ever
	// being loaded.
	MaxPayloadBytes int
}

const claimSQL = `SELECT id, namespace, topic, tenant_id, dedupe_key, ordering_key, sequence_id, payload, headers,
       trace_header, attempt_count, lease_token, lease_expires_at, created_at, payload_bytes
FROM outbox.claim_batch($1, $2, $3, $4, $5, $6, $7, $8)`

// ClaimBatch leases up to p.BatchSize due messages to p.WorkerID: one
// statement, one round trip, whatever the batch size. The messages of one
// ordering key come back together and in sequence order, the key's head
// first. Leases that expired (a crashed or stalled dispatcher's) are taken
// over first, as RepairExpiredLeases does, with the store's attempt
// ceiling: the messages may come back in this same claim.
func (s *Store) ClaimBatch(ctx context.Context, p ClaimParams) ([]outboxtype.Message, error) {
	if p.Lease <= 0 {
		return nil, &Error{Op: "claim", Kind: ErrInvalidArgument, Err: fmt.Errorf("lease must be positive, got %s", p.Lease)}
	}
	if p.MaxRun < 0 || p.MaxBytes < 0 || p.MaxPayloadBytes < 0 {
		return nil, &Error{Op: "claim", Kind: ErrInvalidArgument, Err: fmt.Errorf("MaxRun, MaxBytes and MaxPayloadBytes must not be negative")}
	}
	leaseSeconds := int(math.Ceil(p.Lease.Seconds()))
	var namespaces []string
	if len(p.Namespaces) > 0 {
		namespaces = p.Namespaces
	}
	rows, err := s.db.Query(ctx, claimSQL, p.BatchSize, p.WorkerID, leaseSeconds, namespaces,
		max(p.MaxRun, 1), nullableInt64(p.MaxBytes), nullableInt64(int64(p.MaxPayloadBytes)), s.ceiling())
	if err != nil {
		return nil, translate("claim", err)
	}
	defer rows.Close()
	out := make([]outboxtype.Message, 0, max(p.BatchSize, 0))
	// The nullable columns are scanned into pgtype's value types: into
	// *string and *int64, pgx allocates each non-NULL value through
	// reflection (a third of the claim's CPU on batches of 1,000). They and
	// the message are scanned in place, declared once: scan targets escape,
	// and a message declared per row was a heap object per row.
	var (
		tenant, dedupe, ordering, trace pgtype.Text
		sequence                        pgtype.Int8
		// Read in place from the row: the headers are decoded here or not
		// at all (most are {}), and namespaces and topics are a few values
		// repeated across the batch (interned), not a heap object per row
		// each. The payload is copied out of the row once.
		namespace, topic, payload, headers pgtype.DriverBytes
		names                              = map[string]string{}
	)
	for rows.Next() {
		out = append(out, outboxtype.Message{})
		m := &out[len(out)-1]
		// The payload is scanned as raw bytes: scanning jsonb into a
		// json.RawMessage would run json.Unmarshal over every payload to copy
		// what PostgreSQL already guarantees is valid JSON. The ids are
		// scanned as the 16 bytes they are: as a uuid.UUID, pgx would format
		// each as text for uuid.Parse to read back. docs/PERFORMANCE.md has
		// what each cost.
		if err := rows.Scan((*[16]byte)(&m.ID), &namespace, &topic, &tenant, &dedupe, &ordering, &sequence,
			&payload, &headers, &trace, &m.Attempt, (*[16]byte)(&m.LeaseToken), &m.LeaseExpiresAt, &m.CreatedAt,
			&m.PayloadBytes); err != nil {
			return nil, translate("claim", err)
		}
		m.Namespace, m.Topic = intern(names, namespace), intern(names, topic)
		m.Payload = bytes.Clone(payload) // nil stays nil: the claim left the payload out
		if len(headers) > 2 {            // not "{}"
			if err := json.Unmarshal(headers, &m.Headers); err != nil {
				m.Headers = nil
				m.DecodeError = fmt.Errorf("headers %s are not a JSON object of strings: %w", abbreviate(headers, 120), err)
			}
		}
		// A NULL's String and Int64 are their zero values.
		m.TenantID, m.DedupeKey, m.OrderingKey, m.TraceHeader = tenant.String, dedupe.String, ordering.String, trace.String
		m.SequenceID = sequence.Int64
		if m.TraceHeader == "" && m.Headers != nil {
			// A producer traced with OpenTelemetry alone: X-Ray (the
			// dispatcher's spans, EventBridge's and SNS's trace header)
			// joins the same trace.
			m.TraceHeader = producerheaders.XRayTraceHeader(m.Headers[producerheaders.TraceParent])
		}
	}
	if err := rows.Err(); err != nil {
		return nil, translate("claim", err)
	}
	sortRuns(out)
	return out, nil
}

// intern returns b as a string, the same string for the same bytes: the
// lookup converts b without allocating, so only a value not seen before in
// the claim is copied.
func intern(seen map[string]string, b []byte) string {
	if s, ok := seen[string(b)]; ok {
		return s
	}
	s := string(b)
	seen[s] = s
	return s
}

// sortRuns puts each ordering key's messages together, in sequence order,
// where the key first appears; unordered messages keep their places.
func sortRuns(msgs []outboxtype.Message) {
	type key struct{ namespace, orderingKey string }
	group := make([]int, len(msgs)) // position of the message's key (its own, unordered)
	first := map[key]int{}
	for i := range msgs {
		group[i] = i
		if msgs[i].OrderingKey == "" {
			continue
		}
		k := key{msgs[i].Namespace, msgs[i].OrderingKey}
		if at, seen := first[k]; seen {
			group[i] = at
		} else {
			first[k] = i
		}
	}
	if len(first) == 0 {
		return
	}
	order := make([]int, len(msgs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(group[a], group[b]), cmp.Compare(msgs[a].SequenceID, msgs[b].SequenceID))
	})
	sorted := make([]outboxtype.Message, len(msgs))
	for i, j := range order {
		sorted[i] = msgs[j]
	}
	copy(msgs, sorted)
}

// Result is one message's outcome, reported by the worker holding its lease.
type Result struct {
	ID         uuid.UUID
	LeaseToken uuid.UUID
	Outcome    outboxtype.Outcome
	// ErrorCode and ErrorMessage explain a Retryable or Failed outcome.
	ErrorCode    string
	ErrorMessage string
	// Target names where the message went; TargetRef is the target's id for
	// the delivery (an SNS MessageId, an EventBridge EventId, an HTTP status).
	Target    string
	TargetRef string
	Latency   time.Duration
	// RetryAt is when a Retryable message is due again (zero: now).
	RetryAt time.Time
	// OnDead is the route's policy should this ordered message die now or
	// later ("": as last reported, skip when never).
	OnDead outboxtype.OnDead
	// Hold marks a Retryable outcome of a configuration failure (access
	// denied, a missing target or route): the message is retried without
	// end and never dead-lettered at the attempt ceiling.
	Hold bool
}

// Completion pairs a message id with its Status.
type Completion struct {
	ID     uuid.UUID
	Status outboxtype.Status
}

// completeBatchSQL sends the results as typed arrays, one element per
// result, instead of complete_batch's JSON document: PostgreSQL decodes a
// binary uuid[] far faster than it parses 1,000 JSON objects, and nothing
// here encodes them. With p_omit_ok it answers only for the results not
// recorded as ok, which are the exceptions a caller acts on.
const completeBatchSQL = `SELECT id, status FROM outbox.complete_batch($1, NULL, $2, true,
	$3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`

// CompleteBatch records every result in one statement (one round trip,
// whatever the batch size) and returns one Completion per result, in order.
// A lease lost, or a double dispatch, on one message is reported for that
// message only; an error means nothing at all was written.
func (s *Store) CompleteBatch(ctx context.Context, workerID string, results []Result) ([]Completion, error) {
	if len(results) == 0 {
		return nil, nil
	}
	n := len(results)
	// pgtype types, not uuid.UUID or *string: under the simple protocol
	// (RDS Proxy) pgx must know each array's type from its Go type.
	var (
		ids           = make([]pgtype.UUID, n)
		tokens        = make([]pgtype.UUID, n)
		outcomes      = make([]pgtype.Text, n)
		latencies     = make([]pgtype.Int4, n)
		errorCodes    = optionalText{n: n}
		errorMessages = optionalText{n: n}
		targets       = optionalText{n: n}
		targetRefs    = optionalText{n: n}
		onDead        = optionalText{n: n}
		retryAt       []pgtype.Timestamptz
		hold          []pgtype.Bool
	)
	for i := range results {
		r := &results[i]
		ids[i] = pgtype.UUID{Bytes: r.ID, Valid: true}
		tokens[i] = pgtype.UUID{Bytes: r.LeaseToken, Valid: true}
		outcomes[i] = pgtype.Text{String: string(r.Outcome), Valid: true}
		latencies[i] = pgtype.Int4{Int32: int32(min(r.Latency.Milliseconds(), math.MaxInt32)), Valid: true}
		errorCodes.set(i, r.ErrorCode)
		errorMessages.set(i, r.ErrorMessage)
		targets.set(i, r.Target)
		targetRefs.set(i, r.TargetRef)
		onDead.set(i, string(r.OnDead))
		if !r.RetryAt.IsZero() {
			if retryAt == nil {
				retryAt = make([]pgtype.Timestamptz, n)
			}
			retryAt[i] = pgtype.Timestamptz{Time: r.RetryAt, Valid: true}
		}
		if r.Hold {
			if hold == nil {
				hold = make([]pgtype.Bool, n)
			}
			hold[i] = pgtype.Bool{Bool: true, Valid: true}
		}
	}
	rows, err := s.db.Query(ctx, completeBatchSQL, workerID, s.ceiling(), pointers(ids), pointers(tokens), pointers(outcomes),
		errorCodes.arg(), errorMessages.arg(), targets.arg(), targetRefs.arg(), pointers(latencies), pointers(retryAt),
		onDead.arg(), pointers(hold))
	if err != nil {
		return nil, translate("complete", err)
	}
	defer rows.Close()
	out := make([]Completion, n)
	for i := range results {
		out[i] = Completion{ID: results[i].ID, Status: outboxtype.StatusOK}
	}
	// The exceptions come in the results' order: each is matched to the
	// next result of its id.
	next := 0
	for rows.Next() {
		var c Completion
		if err := rows.Scan(&c.ID, &c.Status); err != nil {
			return nil, translate("complete", err)
		}
		for next < n && results[next].ID != c.ID {
			next++
		}
		if next == n {
			return nil, &Error{Op: "complete", Err: fmt.Errorf("complete_batch answered %q for message %s, which is not among the results or out of their order", c.Status, c.ID)}
		}
		out[next].Status = c.Status
		next++
	}
	if err := rows.Err(); err != nil {
		return nil, translate("complete", err)
	}
	return out, nil
}

// optionalText is one optional text field across a batch: an empty string
// is none (NULL), and a field no result sets is sent as NULL whole.
type optionalText struct {
	n      int
	values []pgtype.Text
}

func (c *optionalText) set(i int, s string) {
	if s == "" {
		return
	}
	if c.values == nil {
		c.values = make([]pgtype.Text, c.n)
	}
	c.values[i] = pgtype.Text{String: s, Valid: true}
}

func (c *optionalText) arg() pgtype.FlatArray[*pgtype.Text] { return pointers(c.values) }

// pointers makes an array argument of values whose elements are pointers to
// them. pgx hands each element of an array argument to its encoder as an
// interface value, which copies every element that is not a pointer to the
// heap; and a pointer to a type pgx encodes only through reflection (a
// *string, an *int32) is dereferenced there into a heap copy all the same.
// A pointer to a pgtype value goes into an interface as it is, and its
// encoder takes it through the type's valuer interface: no object per
// result (TestCompleteBatchEncodesItsResultsWithoutAnObjectEach). The
// argument is NULL when values is nil, and the array types are pgx's
// registered ones, so the simple protocol (RDS Proxy) knows each array's
// type from its Go type.
func pointers[T any](values []T) pgtype.FlatArray[*T] {
	if values == nil {
		return nil
	}
	out := make(pgtype.FlatArray[*T], len(values))
	for i := range values {
		out[i] = &values[i]
	}
	return out
}

const completeSQL = `SELECT outbox.complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`

// Complete records one result. It returns an error wrapping ErrLeaseLost when
// the lease is no longer this worker's (nothing written), and [outboxtype.StatusDead] when
// a Retryable outcome hit the attempt ceiling.
func (s *Store) Complete(ctx context.Context, workerID string, r Result) (outboxtype.Status, error) {
	var retryAt *time.Time
	if !r.RetryAt.IsZero() {
		retryAt = &r.RetryAt
	}
	var status outboxtype.Status
	err := s.db.QueryRow(ctx, completeSQL, workerID, r.ID, r.LeaseToken, string(r.Outcome),
		nullable(r.ErrorCode), nullable(r.ErrorMessage), nullable(r.Target), nullable(r.TargetRef),
		r.Latency.Milliseconds(), retryAt, s.ceiling()).Scan(&status)
	if err != nil {
		return "", translate("complete", err)
	}
	return status, nil
}

// RepairExpiredLeases makes up to limit messages whose lease expired due
// again (each gets a ZOMBIE_REQUEUE attempt), or dead-letters those already
// at the attempt ceiling. It returns how many it repaired.
func (s *Store) RepairExpiredLeases(ctx context.Context, workerID string, limit int) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT outbox.repair_expired_leases($1, $2, $3)`, limit, workerID, s.ceiling()).Scan(&n)
	if err != nil {
		return 0, translate("repair", err)
	}
	return n, nil
}

// ClaimableEstimate counts, up to limit, what claims of namespaces (nil:
// all) could take now: due heads of ordering keys (one per key, whatever
// the run behind it) and unordered messages, plus the messages of expired
// leases, which a claim takes over. It reads at most limit index entries of
// each kind, never the whole queue, so it is cheap enough to ask before
// deciding how many dispatchers to start; it is an estimate, not a promise
// (uncommitted claims' messages still count).
func (s *Store) ClaimableEstimate(ctx context.Context, limit int, namespaces []string) (int, error) {
	if len(namespaces) == 0 {
		namespaces = nil
	}
	var n int64
	err := s.db.QueryRow(ctx, `SELECT outbox.claimable_estimate($1, $2)`, limit, namespaces).Scan(&n)
	if err != nil {
		return 0, translate("estimate", err)
	}
	return int(n), nil
}

// ReplayRequest selects dead letters to move back to pending. The filters
// combine with AND; an empty filter matches every dead letter (callers facing
// people should refuse that unless asked explicitly).
type ReplayRequest struct {
	MessageIDs   []uuid.UUID
	Namespace    string
	Topic        string
	ErrorCode    string
	FailedAfter  time.Time // inclusive
	FailedBefore time.Time // exclusive
	// Limit caps the rows (oldest first); 1-10,000.
	Limit int
	// DryRun lists what matches without moving anything.
	DryRun bool
	// Operator and Reason are recorded on each REPLAYED attempt.
	Operator string
	Reason   string
}

// ReplayDead moves the matching dead letters (oldest first) back to pending,
// due now, with the same id and sequence id and a fresh attempt count, or
// with DryRun only lists them. It returns the ids matched (dry run) or moved.
func (s *Store) ReplayDead(ctx context.Context, r ReplayRequest) ([]uuid.UUID, error) {
	var ids []uuid.UUID
	if len(r.MessageIDs) > 0 {
		ids = r.MessageIDs
	}
	rows, err := s.db.Query(ctx,
		`SELECT message_id FROM outbox.replay_dead($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		ids, nullable(r.Namespace), nullable(r.Topic), nullable(r.ErrorCode),
		nullableTime(r.FailedAfter), nullableTime(r.FailedBefore), r.Limit, r.DryRun,
		nullable(r.Operator), nullable(r.Reason))
	if err != nil {
		return nil, translate("replay", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, translate("replay", err)
	}
	return out, nil
}

// TopicStats is the queue's state for one (namespace, topic).
type TopicStats struct {
	Namespace string `json:"namespace"`
	Topic     string `json:"topic"`
	Counts
	// TopErrorCode is the most frequent last error code of the topic's
	// pending messages and dead letters, TopErrorCount how many have it.
	TopErrorCode  string `json:"top_error_code,omitempty"`
	TopErrorCount int64  `json:"top_error_count,omitempty"`
}

// Counts is the queue's state for a topic, or summed over several (the
// metrics function's totals).
type Counts struct {
	// Pending counts every undelivered message, leased or not.
	Pending int64 `json:"pending"`
	// Due counts unleased messages whose time has come.
	Due int64 `json:"due"`
	// Leased counts messages a dispatcher holds.
	Leased int64 `json:"leased"`
	// ExpiredLeases counts leases past their expiry: a crashed or stuck
	// dispatcher, waiting for the reaper.
	ExpiredLeases int64 `json:"expired_leases"`
	// OldestPendingAgeSeconds is how long the oldest available message has
	// waited.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	// Dead counts dead letters.
	Dead int64 `json:"dead"`
	// BlockedKeys counts the ordering keys BlockedKeys lists whose message
	// waited on is of this topic: its head retrying, leased past its
	// expiry, or dead and parked, or the key unsettled.
	BlockedKeys int64 `json:"blocked_keys"`
	// OldestBlockedKeyAgeSeconds is how long the longest-blocked of them
	// has been blocked.
	OldestBlockedKeyAgeSeconds float64 `json:"oldest_blocked_key_age_seconds"`
	// Retrying counts unleased messages that failed and wait for their
	// next attempt (not paused ones).
	Retrying int64 `json:"retrying"`
	// Paused counts unleased messages of a paused namespace or topic:
	// claims skip them, and they count in neither Due nor the oldest age.
	Paused int64 `json:"paused"`
}

// Add sums c's counts and o's, and keeps the older of each oldest age.
func (c *Counts) Add(o Counts) {
	c.Pending += o.Pending
	c.Due += o.Due
	c.Leased += o.Leased
	c.ExpiredLeases += o.ExpiredLeases
	c.Dead += o.Dead
	c.OldestPendingAgeSeconds = max(c.OldestPendingAgeSeconds, o.OldestPendingAgeSeconds)
	c.BlockedKeys += o.BlockedKeys
	c.OldestBlockedKeyAgeSeconds = max(c.OldestBlockedKeyAgeSeconds, o.OldestBlockedKeyAgeSeconds)
	c.Retrying += o.Retrying
	c.Paused += o.Paused
}

// Stats reads outbox.stats(): one row per (namespace, topic) with pending or
// dead messages.
func (s *Store) Stats(ctx context.Context) ([]TopicStats, error) {
	rows, err := s.db.Query(ctx, `SELECT namespace, topic, pending, due, leased, expired_leases, oldest_pending_age_seconds, dead,
       blocked_keys, oldest_blocked_key_age_seconds, retrying, paused, top_error_code, top_error_count FROM outbox.stats()`)
	if err != nil {
		return nil, translate("stats", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TopicStats, error) {
		var (
			t    TopicStats
			code *string
		)
		err := row.Scan(&t.Namespace, &t.Topic, &t.Pending, &t.Due, &t.Leased, &t.ExpiredLeases, &t.OldestPendingAgeSeconds, &t.Dead,
			&t.BlockedKeys, &t.OldestBlockedKeyAgeSeconds, &t.Retrying, &t.Paused, &code, &t.TopErrorCount)
		t.TopErrorCode = deref(code)
		return t, err
	})
	if err != nil {
		return nil, translate("stats", err)
	}
	return out, nil
}

// PurgeParams bound one retention pass.
type PurgeParams struct {
	// AttemptsOlderThan purges archived attempts older than this (0: keep all).
	// The history of messages still pending or dead is always kept, and so
	// are operators' actions (only an operator's purge_audit takes them).
	AttemptsOlderThan time.Duration
	// DedupeOlderThan forgets a dedupe key this long after its message was
	// delivered or discarded (0: keep all), whatever the archive's
	// retention. Keys of messages still pending or dead are always kept.
	DedupeOlderThan time.Duration
	// KeysOlderThan forgets the bookkeeping of ordering keys with nothing
	// pending or dead that have been idle this long (0: keep all). A key
	// that comes back continues with higher sequence ids.
	KeysOlderThan time.Duration
	// MaxRows bounds the rows deleted from each table in this pass.
	MaxRows int
}

// PurgeResult says what one pass deleted.
type PurgeResult struct {
	Attempts int64 `json:"purged_attempts"`
	Dedupe   int64 `json:"purged_dedupe"`
	Keys     int64 `json:"purged_keys"`
}

// Purge runs one bounded retention pass over the attempts archive, the
// dedupe keys and idle ordering keys.
func (s *Store) Purge(ctx context.Context, p PurgeParams) (PurgeResult, error) {
	if p.AttemptsOlderThan < 0 || p.DedupeOlderThan < 0 || p.KeysOlderThan < 0 {
		return PurgeResult{}, &Error{Op: "purge", Kind: ErrInvalidArgument, Err: fmt.Errorf("retention must not be negative")}
	}
	var res PurgeResult
	err := s.db.QueryRow(ctx, `SELECT purged_attempts, purged_dedupe, purged_keys FROM outbox.purge($1, $2, $3, $4)`,
		nullableInterval(p.AttemptsOlderThan), nullableInterval(p.DedupeOlderThan), p.MaxRows,
		nullableInterval(p.KeysOlderThan)).Scan(&res.Attempts, &res.Dedupe, &res.Keys)
	if err != nil {
		return PurgeResult{}, translate("purge", err)
	}
	return res, nil
}

// ArchiveDaysAhead is how many days after today the reaper keeps the
// archive's partitions made (outbox.ensure_archive_partitions): days of
// reaper outages before a day's rows would go to the DEFAULT partition.
const ArchiveDaysAhead = 3

// EnsureArchivePartitions makes the archive's partitions for today and the
// daysAhead days after it that do not exist yet, and returns how many it
// made. Another maker at work, or the archive too busy to lock for an
// instant, leaves them to the next call.
func (s *Store) EnsureArchivePartitions(ctx context.Context, daysAhead int) (int, error) {
	var made int
	if err := s.db.QueryRow(ctx, `SELECT outbox.ensure_archive_partitions($1)`, daysAhead).Scan(&made); err != nil {
		return 0, translate("archive partitions", err)
	}
	return made, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullableTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nullableInt64(n int64) *int64 {
	if n == 0 {
		return nil
	}
	return &n
}

// abbreviate shortens b for an error message.
func abbreviate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}

func nullableInterval(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}
