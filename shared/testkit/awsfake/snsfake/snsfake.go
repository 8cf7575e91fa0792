// Package snsfake is a wire-level Amazon SNS double for tests: an httptest
// server that speaks the SNS query protocol for PublishBatch, so that a real
// aws-sdk-go-v2 SNS client — its serializer, signer, retryer and
// deserializer — runs unchanged against it. Unlike an emulator it can inject
// every failure SNS is known for: per-entry failures (with or without
// SenderFault), whole-call errors with any status and code, latency, stalls
// and dropped connections.
//
//	fake := snsfake.New(t)
//	client := sns.NewFromConfig(fake.Config())
//	fake.FailMessage(snsfake.ID(msgID), "InternalError", false)
//	fake.FailCalls(1, http.StatusBadRequest, "Throttling")
//
// Faults: FailMessage (an entry in the Failed list), FailCalls (the next n
// calls fail whole), FailCallsContaining (every call carrying an entry
// fails whole), OmitMessage (an entry in neither list), DropCalls (the
// connection closes unanswered), SetLatency, Stall and Resume.
// Observations: Received and ReceivedIDs (accepted entries), Calls and
// CallIDs (every request, decoded, with its answer), Requests, MaxInFlight
// and Connections.
//
// The fake enforces the limits SNS enforces on a PublishBatch request (at
// most 10 entries with distinct, well-formed ids; the aggregate size within
// the topic's cap; at most 10 well-formed message attributes per entry; a
// MessageGroupId and MessageDeduplicationId on every entry to a FIFO topic,
// neither a deduplication id on a standard one), so a test that passes
// against it has also shown that the publisher never sends what SNS would
// refuse. Its answers were checked against the SDK's own deserializers
// (service/sns deserializers.go) and the requests it parses against the
// SDK's serializers.
//
// Like SNS, the fake refuses a request without a SigV4 Authorization header
// (one a client without credentials sends) with 403
// MissingAuthenticationToken; it does not verify the signature.
//
// Messages are identified by their "outbox.id" message attribute, or, for
// messages without one, by the "msg_id" field of the payload (which the
// publisher conformance suite puts in every payload).
package snsfake

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/faults"
)

// Region and AccountID are those of the ARNs the fake hands out.
const (
	Region    = "us-east-1"
	AccountID = "123456789012"
)

// DefaultMaxMessageBytes is the default cap on one message and on one
// PublishBatch request: SNS's 256 KiB.
const DefaultMaxMessageBytes = 262144

// TopicARN is the ARN of a topic called name in the fake's region and
// account. The fake accepts any topic ARN; a name ending in ".fifo" makes it
// a FIFO topic.
func TopicARN(name string) string {
	return "arn:aws:sns:" + Region + ":" + AccountID + ":" + name
}

// Attribute is one message attribute as SNS received it.
type Attribute struct {
	// DataType is String, Number or Binary, optionally with a custom suffix
	// ("String.json").
	DataType string
	// StringValue is the value of a String or Number attribute.
	StringValue string
	// BinaryValue is the decoded value of a Binary attribute.
	BinaryValue []byte
}

// Entry is one PublishBatch request entry as SNS received it, decoded.
type Entry struct {
	// TopicArn is the topic of the request that carried the entry.
	TopicArn string
	// ID is the entry's Id, unique within its request.
	ID string
	// Message is the message body.
	Message string
	// Attributes are the entry's message attributes by name.
	Attributes map[string]Attribute
	// The FIFO ids, spelled as SNS and the SDK spell them; empty when not
	// sent.
	MessageGroupId         string
	MessageDeduplicationId string
	// Subject and MessageStructure are empty when not sent.
	Subject          string
	MessageStructure string
	// OutboxID is the outbox message id: the "outbox.id" attribute, else the
	// payload's "msg_id"; uuid.Nil when it carries neither.
	OutboxID uuid.UUID
	// MessageID is the id the fake answered for an accepted entry.
	MessageID string
}

// Size is the entry's size as SNS counts it against the topic's cap: the
// message body plus, for each attribute, its name, data type and value.
func (e Entry) Size() int {
	n := len(e.Message)
	for name, a := range e.Attributes {
		n += len(name) + len(a.DataType) + len(a.StringValue) + len(a.BinaryValue)
	}
	return n
}

// Call is one HTTP request the fake received.
type Call struct {
	// TopicArn is the request's topic.
	TopicArn string
	// Entries are the request's entries, in request order, whatever the
	// answer.
	Entries []Entry
	// Bytes is the request's aggregate size as SNS counts it.
	Bytes int
	// Status is the HTTP status the fake answered; 0 when the fake dropped
	// the connection or the client gave up first.
	Status int
	// Code is the error code of a failed call, "" for a success.
	Code string
}

// Match selects entries, for FailMessage and FailCallsContaining.
type Match func(Entry) bool

// ID matches the entry of outbox message id.
func ID(id uuid.UUID) Match { return func(e Entry) bool { return e.OutboxID == id } }

// Option configures a Server.
type Option func(*Server)

// WithMaxMessageBytes sets the topic's cap on one message and on one request
// (default 262144, SNS's default). Over it, a request fails whole with 400
// BatchRequestTooLong, as SNS does.
func WithMaxMessageBytes(n int) Option { return func(s *Server) { s.maxMessageBytes = n } }

// Server is a running fake. Its methods are safe for concurrent use.
type Server struct {
	srv             *httptest.Server
	maxMessageBytes int
	// idPrefix and idCounter make unique UUID-shaped ids without a call to
	// the system's random source per id.
	idPrefix    [8]byte
	idCounter   atomic.Uint64
	connections atomic.Int64
	// served is the sum over requests of the time from each one's arrival
	// to its answer (ServedTime).
	served atomic.Int64
	// SetLatency, Stall and Resume.
	faults.Controls
	// MaxInFlight.
	faults.InFlight

	mu             sync.Mutex
	calls          []Call
	received       []Entry
	requests       int
	drop           int
	callFailures   []callFailure
	poisons        []poison
	entryFailures  []entryFailure
	omissions      []Match
	sequenceNumber uint64
}

type callFailure struct {
	remaining int
	status    int
	code      string
}

type poison struct {
	match  Match
	status int
	code   string
}

type entryFailure struct {
	match       Match
	code        string
	senderFault bool
}

// New starts a fake, closed when the test ends.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{maxMessageBytes: DefaultMaxMessageBytes}
	prefix := uuid.New()
	copy(s.idPrefix[:], prefix[:8])
	for _, o := range opts {
		o(s)
	}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			s.connections.Add(1)
		}
	}
	s.srv.Start()
	// Cleanups run last-in first-out: release held calls, then close.
	t.Cleanup(s.srv.Close)
	t.Cleanup(func() { faults.Release(&s.Controls) })
	return s
}

// URL is the fake's endpoint, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.srv.URL }

// Config is an AWS configuration for a real SNS client that talks to the
// fake: its region, static credentials and BaseEndpoint.
func (s *Server) Config() aws.Config {
	return aws.Config{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider("snsfake", "snsfake", ""),
		BaseEndpoint: aws.String(s.srv.URL),
	}
}

// Received returns the entries the fake accepted, in the order it answered
// them. An entry that failed, or whose call failed, is not in it.
func (s *Server) Received() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.received)
}

// ReceivedIDs returns the OutboxID of every accepted entry.
func (s *Server) ReceivedIDs() []uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uuid.UUID, len(s.received))
	for i, e := range s.received {
		out[i] = e.OutboxID
	}
	return out
}

// Calls returns every request the fake has received, in arrival order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// CallIDs returns, for every request the fake has received, the OutboxID of
// each of its entries in request order: what a test needs to check the
// order in which messages were sent.
func (s *Server) CallIDs() [][]uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]uuid.UUID, len(s.calls))
	for i, c := range s.calls {
		out[i] = make([]uuid.UUID, len(c.Entries))
		for j, e := range c.Entries {
			out[i][j] = e.OutboxID
		}
	}
	return out
}

// Requests is the number of HTTP requests received, whatever their answer.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Connections is the number of TCP connections clients have opened to the
// fake. A client whose pool keeps enough idle connections opens no more
// than the calls it has in flight at once.
func (s *Server) Connections() int { return int(s.connections.Load()) }

// ServedTime is the fake's own time over every request so far, from each
// one's arrival (its headers read) to its answer written: with a latency
// set, what the latency became on this machine — the timer waking late and
// the answer's encoding included — so that a benchmark can tell the fake's
// share of a call from the client's.
func (s *Server) ServedTime() time.Duration { return time.Duration(s.served.Load()) }

// FailMessage makes every matching entry fail in the Failed list of its
// call's answer, with code and senderFault, from now on. SNS sets
// SenderFault false for its own failures (InternalError) and true for the
// caller's (InvalidParameter, KMSAccessDenied).
func (s *Server) FailMessage(match Match, code string, senderFault bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entryFailures = append(s.entryFailures, entryFailure{match: match, code: code, senderFault: senderFault})
}

// OmitMessage makes the fake accept every matching entry but leave it out
// of both the Successful and the Failed list of its answer — an answer SNS
// should never give, which a publisher must still not lose a message over.
// The entry counts as received: SNS may well have published it.
func (s *Server) OmitMessage(match Match) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.omissions = append(s.omissions, match)
}

// FailCalls makes the next n calls fail whole with the HTTP status and the
// error code (e.g. 400 Throttling, 500 InternalError, 403
// AuthorizationError, 404 NotFound). Successive FailCalls queue up.
func (s *Server) FailCalls(n int, status int, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.callFailures = append(s.callFailures, callFailure{remaining: n, status: status, code: code})
}

// FailCallsContaining makes every call that carries a matching entry fail
// whole with status and code, from now on — the way SNS refuses a whole
// request over one entry it cannot validate.
func (s *Server) FailCallsContaining(match Match, status int, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.poisons = append(s.poisons, poison{match: match, status: status, code: code})
}

// DropCalls makes the next n calls end with the connection closed and no
// answer: the client sees an EOF or a reset.
func (s *Server) DropCalls(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop += n
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	defer func() { s.served.Add(int64(time.Since(arrived))) }()
	defer faults.Enter(&s.InFlight)()
	s.mu.Lock()
	s.requests++
	s.mu.Unlock()
	requestID := s.newID()

	if !signed(r) {
		// SNS checks the signature before it reads the request.
		s.record(Call{}, http.StatusForbidden, "MissingAuthenticationToken")
		writeError(w, http.StatusForbidden, "MissingAuthenticationToken", "Request is missing Authentication Token", requestID)
		return
	}
	req, werr := parseRequest(r)
	if werr != nil {
		s.record(Call{}, werr.status, werr.code)
		writeError(w, werr.status, werr.code, werr.message, requestID)
		return
	}
	call := Call{TopicArn: req.topicARN, Entries: req.entries}
	for _, e := range req.entries {
		call.Bytes += e.Size()
	}
	// Validate before the wait, which counts from the request's arrival:
	// the latency is the whole time SNS takes to answer.
	invalid := s.validate(req)
	problems := make([]string, len(req.entries))
	for i, e := range req.entries {
		problems[i] = entryProblem(e)
	}

	if !faults.Wait(r.Context(), &s.Controls, arrived) {
		s.record(call, 0, "")
		return
	}

	s.mu.Lock()
	if s.drop > 0 {
		s.drop--
		s.calls = append(s.calls, call)
		s.mu.Unlock()
		dropConnection(w)
		return
	}
	if f := s.nextCallFailureLocked(req.entries); f != nil {
		call.Status, call.Code = f.status, f.code
		s.calls = append(s.calls, call)
		s.mu.Unlock()
		writeError(w, f.status, f.code, "injected by snsfake", requestID)
		return
	}
	if invalid != nil {
		call.Status, call.Code = invalid.status, invalid.code
		s.calls = append(s.calls, call)
		s.mu.Unlock()
		writeError(w, invalid.status, invalid.code, invalid.message, requestID)
		return
	}

	var resp batchResult
	for i, e := range req.entries {
		if f, ok := s.entryFailureLocked(e); ok {
			resp.Failed = append(resp.Failed, f)
			continue
		}
		if problems[i] != "" {
			// SNS refuses an entry it cannot take in the Failed list, as a
			// sender fault.
			resp.Failed = append(resp.Failed, failedEntry{ID: e.ID, Code: "InvalidParameter", Message: problems[i], SenderFault: true})
			continue
		}
		e.MessageID = s.newID()
		if slices.ContainsFunc(s.omissions, func(m Match) bool { return m(e) }) {
			s.received = append(s.received, e)
			continue
		}
		ok := successEntry{ID: e.ID, MessageID: e.MessageID}
		if isFIFO(req.topicARN) {
			s.sequenceNumber++
			ok.SequenceNumber = fmt.Sprintf("%020d", s.sequenceNumber)
		}
		resp.Successful = append(resp.Successful, ok)
		s.received = append(s.received, e)
	}
	call.Status = http.StatusOK
	s.calls = append(s.calls, call)
	s.mu.Unlock()
	writeResult(w, resp, requestID)
}

func (s *Server) record(c Call, status int, code string) {
	c.Status, c.Code = status, code
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

func (s *Server) nextCallFailureLocked(entries []Entry) *callFailure {
	for len(s.callFailures) > 0 && s.callFailures[0].remaining <= 0 {
		s.callFailures = s.callFailures[1:]
	}
	if len(s.callFailures) > 0 {
		s.callFailures[0].remaining--
		f := s.callFailures[0]
		return &f
	}
	for _, p := range s.poisons {
		if slices.ContainsFunc(entries, p.match) {
			return &callFailure{status: p.status, code: p.code}
		}
	}
	return nil
}

func (s *Server) entryFailureLocked(e Entry) (failedEntry, bool) {
	for _, f := range s.entryFailures {
		if f.match(e) {
			return failedEntry{ID: e.ID, Code: f.code, Message: "injected by snsfake", SenderFault: f.senderFault}, true
		}
	}
	return failedEntry{}, false
}

// newID returns a fresh message or request id, shaped like SNS's UUIDs.
func (s *Server) newID() string {
	var id uuid.UUID
	copy(id[:8], s.idPrefix[:])
	binary.BigEndian.PutUint64(id[8:], s.idCounter.Add(1))
	return id.String()
}

// signed reports whether r carries a SigV4 (or SigV4a) Authorization
// header, as every request of a client with credentials does.
func signed(r *http.Request) bool {
	auth := r.Header.Get("Authorization")
	return strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") || strings.HasPrefix(auth, "AWS4-ECDSA-P256-SHA256 ")
}

func dropConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("snsfake: the server cannot hijack connections")
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		// A zero linger turns the close into a reset, as a load balancer
		// dropping the connection would.
		tcp.SetLinger(0)
	}
	conn.Close()
}
