// Package eventbridgefake is a wire-level Amazon EventBridge for tests: an
// httptest server that speaks the AWS JSON 1.1 protocol of PutEvents, so that
// a real aws-sdk-go-v2 eventbridge client (built from [Server.Config]) talks to
// it exactly as it talks to AWS, and a test can inject what AWS does on a bad
// day: per-entry refusals, whole-call errors with any HTTP status and error
// type, short responses, latency, and calls that never answer.
//
// It validates requests the way EventBridge does where that is cheap to do —
// at most 10 entries, Source, DetailType and Detail present, Detail a JSON
// object, the request within its size cap by AWS's entry-size formula — so a
// publisher that breaks those rules fails its tests here rather than in
// production.
//
// Every accepted entry is kept and can be read back with [Server.Received];
// the message ids every request carried, whatever its answer, with
// [Server.CallIDs].
// Messages are told apart by the "msg_id" field of their payload (the
// conformance suite puts one in every payload), or by any [Matcher].
//
// Only PutEvents is implemented; anything else is answered with
// UnknownOperationException. Like EventBridge, the fake refuses a request
// without a SigV4 Authorization header (one a client without credentials
// sends) with 403 MissingAuthenticationTokenException; it does not verify
// the signature.
package eventbridgefake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/faults"
)

// Region is the region Config names; the fake ignores it.
const Region = "us-east-1"

// DefaultMaxRequestBytes is the PutEvents size cap the fake enforces unless
// told otherwise: 256 KiB, the cap of accounts that have not been raised to
// 1 MiB.
const DefaultMaxRequestBytes = 256 * 1024

// maxEntries is EventBridge's limit on entries per PutEvents call.
const maxEntries = 10

// maxTraceHeader is the documented length limit of an entry's TraceHeader.
const maxTraceHeader = 500

// Entry is one PutEvents request entry as the fake decoded it from the wire.
type Entry struct {
	EventBusName string
	Source       string
	DetailType   string
	// Detail is the entry's Detail string exactly as sent.
	Detail string
	// Time is the entry's Time (zero when the entry had none); the wire
	// carries epoch seconds with millisecond precision.
	Time        time.Time
	TraceHeader string
	Resources   []string
	// EventID is the id the fake answered for an accepted entry.
	EventID string
}

// MessageID is the "msg_id" field of the entry's Detail, uuid.Nil when it
// has none.
func (e Entry) MessageID() uuid.UUID {
	var p struct {
		MsgID uuid.UUID `json:"msg_id"`
	}
	if json.Unmarshal([]byte(e.Detail), &p) != nil {
		return uuid.Nil
	}
	return p.MsgID
}

// Matcher picks entries for a fault. It runs on the server's goroutine for
// every entry of every call, under the server's lock: keep it quick and do
// not call the Server from it.
type Matcher func(Entry) bool

// Server is a running fake. Its methods are safe for concurrent use.
type Server struct {
	srv *httptest.Server
	// SetLatency, Stall and Resume.
	faults.Controls
	// MaxInFlight.
	faults.InFlight

	mu              sync.Mutex
	received        []Entry
	calls           [][]Entry // every decoded request's, whatever its fate
	requests        int
	maxRequestBytes int
	messageFaults   map[uuid.UUID]entryFault
	entryFaults     []entryFault
	callFaults      []callFault
	omit            []int // per upcoming call: how many trailing result entries to leave out
	eventIDs        uint64
}

type entryFault struct {
	match   Matcher
	code    string
	message string
}

type callFault struct {
	status    int
	errorType string
	message   string
}

// New starts a fake, closed when t ends.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{maxRequestBytes: DefaultMaxRequestBytes}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serveHTTP))
	t.Cleanup(func() {
		faults.Release(&s.Controls)
		s.srv.Close()
	})
	return s
}

// URL is the server's endpoint, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.srv.URL }

// Config is an AWS configuration for a real eventbridge client that talks to
// this server with static credentials. It turns the SDK's own retries off
// (RetryMaxAttempts 1), so an injected fault reaches the caller exactly as
// injected. To study the SDK's retries, raise RetryMaxAttempts on the copy
// (it caps a custom Retryer too). The client keeps the SDK's default
// transport, which holds 10 idle connections per host: a test with more
// calls in flight than that should give it an HTTPClient that holds more.
func (s *Server) Config() aws.Config {
	return aws.Config{
		Region:           Region,
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDFAKE", "fake-secret", ""),
		BaseEndpoint:     aws.String(s.srv.URL),
		RetryMaxAttempts: 1,
	}
}

// Received returns a copy of every entry accepted so far, in arrival order.
func (s *Server) Received() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Entry(nil), s.received...)
}

// ReceivedIDs returns the "msg_id" of every entry accepted so far.
func (s *Server) ReceivedIDs() []uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uuid.UUID, len(s.received))
	for i, e := range s.received {
		out[i] = e.MessageID()
	}
	return out
}

// CallIDs returns, for every PutEvents request the fake decoded, in arrival
// order, the "msg_id" of each of its entries in request order, whatever the
// request's fate: what a test needs to check the order in which messages
// were sent.
func (s *Server) CallIDs() [][]uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]uuid.UUID, len(s.calls))
	for i, c := range s.calls {
		out[i] = make([]uuid.UUID, len(c))
		for j, e := range c {
			out[i][j] = e.MessageID()
		}
	}
	return out
}

// Requests is how many PutEvents calls have arrived, whatever their fate.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// FailMessage makes every later entry whose payload's "msg_id" is id fail
// with errorCode and errorMessage in its result entry, as EventBridge reports
// a per-entry failure (e.g. "InternalFailure", "MalformedDetail"). Message
// faults are looked up by id, so a soak test can set thousands; they take
// precedence over FailEntries.
func (s *Server) FailMessage(id uuid.UUID, errorCode, errorMessage string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.messageFaults == nil {
		s.messageFaults = map[uuid.UUID]entryFault{}
	}
	s.messageFaults[id] = entryFault{code: errorCode, message: errorMessage}
}

// FailEntries makes every later entry that match picks fail with errorCode
// and errorMessage. The first matching fault wins.
func (s *Server) FailEntries(match Matcher, errorCode, errorMessage string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entryFaults = append(s.entryFaults, entryFault{match: match, code: errorCode, message: errorMessage})
}

// FailCalls makes the next n calls fail as a whole with HTTP status and the
// AWS error type errorType (e.g. 400 "ThrottlingException", 500
// "InternalException"), in the body's "__type" as EventBridge sends it. An
// empty errorType sends an empty body, as a proxy or load balancer might.
// Calls queue up: FailCalls twice fails the next n1+n2 calls in that order.
func (s *Server) FailCalls(n, status int, errorType string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.callFaults = append(s.callFaults, callFault{status: status, errorType: errorType, message: "injected " + errorType})
	}
}

// ClearFaults removes every fault set so far — message and entry faults,
// queued call faults and omissions — so that later calls succeed again.
// Latency and Stall are left as they are.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.messageFaults, s.entryFaults, s.callFaults, s.omit = nil, nil, nil, nil
}

// OmitResults makes the next calls answer 200 with their last omit result
// entries missing: the entries are accepted (and Received) but the caller is
// not told so, as a truncated or buggy answer would leave it.
func (s *Server) OmitResults(calls, omit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range calls {
		s.omit = append(s.omit, omit)
	}
}

// SetMaxRequestBytes sets the size cap, by AWS's entry-size formula, that a
// whole request (and so each entry) must stay within; a request over it is
// refused with ValidationException, as EventBridge refuses it.
func (s *Server) SetMaxRequestBytes(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxRequestBytes = n
}

// wireRequest is the PutEvents request body.
type wireRequest struct {
	Entries []struct {
		EventBusName *string  `json:"EventBusName"`
		Source       *string  `json:"Source"`
		DetailType   *string  `json:"DetailType"`
		Detail       *string  `json:"Detail"`
		Time         *float64 `json:"Time"`
		TraceHeader  *string  `json:"TraceHeader"`
		Resources    []string `json:"Resources"`
	} `json:"Entries"`
	EndpointID *string `json:"EndpointId"`
}

// wireResult is one result entry of the PutEvents response.
type wireResult struct {
	EventID      string `json:"EventId,omitempty"`
	ErrorCode    string `json:"ErrorCode,omitempty"`
	ErrorMessage string `json:"ErrorMessage,omitempty"`
}

type wireResponse struct {
	FailedEntryCount int          `json:"FailedEntryCount"`
	Entries          []wireResult `json:"Entries"`
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	if r.Method != http.MethodPost || r.Header.Get("X-Amz-Target") != "AWSEvents.PutEvents" {
		writeError(w, http.StatusBadRequest, "UnknownOperationException",
			fmt.Sprintf("%s %s with X-Amz-Target %q: this fake serves only POST AWSEvents.PutEvents",
				r.Method, r.URL.Path, r.Header.Get("X-Amz-Target")))
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-amz-json-1.1" {
		writeError(w, http.StatusBadRequest, "SerializationException", fmt.Sprintf("Content-Type %q, want application/x-amz-json-1.1", ct))
		return
	}

	defer faults.Enter(&s.InFlight)()
	s.mu.Lock()
	s.requests++
	s.mu.Unlock()
	if !signed(r) {
		// EventBridge checks the signature before it reads the request.
		writeError(w, http.StatusForbidden, "MissingAuthenticationTokenException", "Missing Authentication Token")
		return
	}

	// Reading the request is part of the latency, as it is for the real
	// service; so is all the work that does not change the fake's state.
	var req wireRequest
	if err := decodeRequest(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "SerializationException", "body is not a PutEvents request: "+err.Error())
		return
	}
	call := decodeCall(&req)
	s.mu.Lock()
	s.calls = append(s.calls, call.entries)
	s.mu.Unlock()

	if !faults.Wait(r.Context(), &s.Controls, arrived) {
		return // the caller gave up, or the test ended; nothing is accepted
	}

	status, body := s.answer(call)
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-RequestId", uuid.NewString())
	w.WriteHeader(status)
	w.Write(body)
}

// decodeRequest reads the body whole, sized by its Content-Length, and
// unmarshals it: cheaper than a streaming decoder's growing buffer.
func decodeRequest(r *http.Request, req *wireRequest) error {
	buf := bytes.NewBuffer(make([]byte, 0, max(r.ContentLength, 0)+1))
	if _, err := buf.ReadFrom(r.Body); err != nil {
		return err
	}
	return json.Unmarshal(buf.Bytes(), req)
}

// decodedCall is a request read into Entries, with what EventBridge's checks
// need to know about each.
type decodedCall struct {
	entries []Entry
	// refusals[i] is the per-entry error code and message EventBridge gives
	// entries[i] on its own merits ("" to accept it).
	refusals []wireResult
	// size is the request's total by AWS's entry-size formula.
	size int
	// invalid is why EventBridge refuses the whole request ("" if it
	// does not, before the size cap).
	invalid string
}

func decodeCall(req *wireRequest) decodedCall {
	c := decodedCall{entries: make([]Entry, len(req.Entries)), refusals: make([]wireResult, len(req.Entries))}
	if n := len(req.Entries); n < 1 || n > maxEntries {
		c.invalid = fmt.Sprintf("1 validation error detected: Value at 'entries' failed to satisfy constraint: Member must have length between 1 and %d (got %d)", maxEntries, n)
	}
	for i, in := range req.Entries {
		e := Entry{
			EventBusName: deref(in.EventBusName), Source: deref(in.Source), DetailType: deref(in.DetailType),
			Detail: deref(in.Detail), TraceHeader: deref(in.TraceHeader), Resources: in.Resources,
		}
		if in.Time != nil {
			e.Time = epochTime(*in.Time)
		}
		if e.TraceHeader != "" && utf8.RuneCountInString(e.TraceHeader) > maxTraceHeader && c.invalid == "" {
			c.invalid = fmt.Sprintf("1 validation error detected: Value at 'entries.%d.member.traceHeader' failed to satisfy constraint: Member must have length less than or equal to %d", i+1, maxTraceHeader)
		}
		c.size += entrySize(in.Source, in.DetailType, in.Detail, in.Time != nil, in.Resources)
		c.entries[i] = e
		c.refusals[i] = entryRefusal(e, in.Source != nil, in.DetailType != nil, in.Detail != nil)
	}
	return c
}

// entryRefusal is the per-entry error EventBridge gives e on its own
// merits, the zero value when it accepts it.
func entryRefusal(e Entry, hasSource, hasDetailType, hasDetail bool) wireResult {
	switch {
	case !hasSource || e.Source == "":
		return wireResult{ErrorCode: "InvalidArgument", ErrorMessage: "Parameter Source is not valid. Reason: Source is a required argument."}
	case !hasDetailType || e.DetailType == "":
		return wireResult{ErrorCode: "InvalidArgument", ErrorMessage: "Parameter DetailType is not valid. Reason: DetailType is a required argument."}
	case utf8.RuneCountInString(e.DetailType) > 128:
		return wireResult{ErrorCode: "InvalidArgument", ErrorMessage: "Parameter DetailType is not valid. Reason: DetailType is longer than 128 characters."}
	case !hasDetail || e.Detail == "":
		return wireResult{ErrorCode: "InvalidArgument", ErrorMessage: "Parameter Detail is not valid. Reason: Detail is a required argument."}
	case !isJSONObject(e.Detail):
		return wireResult{ErrorCode: "MalformedDetail", ErrorMessage: "Detail is malformed."}
	}
	return wireResult{}
}

// answer decides a call's fate under the lock, so that faults are consumed
// in call order and accepted entries recorded atomically; the caller writes
// the answer after the lock is released.
func (s *Server) answer(c decodedCall) (status int, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.callFaults) > 0 {
		f := s.callFaults[0]
		s.callFaults = s.callFaults[1:]
		if f.errorType == "" {
			return f.status, nil
		}
		return f.status, errorBody(f.errorType, f.message)
	}
	if c.invalid == "" && c.size > s.maxRequestBytes {
		c.invalid = fmt.Sprintf("Total size of the entries in the request is over the limit (%d bytes, limit %d).", c.size, s.maxRequestBytes)
	}
	if c.invalid != "" {
		return http.StatusBadRequest, errorBody("ValidationException", c.invalid)
	}

	resp := wireResponse{Entries: c.refusals}
	for i, e := range c.entries {
		if resp.Entries[i].ErrorCode == "" {
			if f, ok := s.fault(e); ok {
				resp.Entries[i] = wireResult{ErrorCode: f.code, ErrorMessage: f.message}
			}
		}
		if resp.Entries[i].ErrorCode != "" {
			resp.FailedEntryCount++
			continue
		}
		e.EventID = s.nextEventID()
		s.received = append(s.received, e)
		resp.Entries[i] = wireResult{EventID: e.EventID}
	}
	if len(s.omit) > 0 {
		n := min(s.omit[0], len(resp.Entries))
		s.omit = s.omit[1:]
		resp.Entries = resp.Entries[:len(resp.Entries)-n]
	}
	body, _ = json.Marshal(resp)
	return http.StatusOK, body
}

// fault is the injected fault for e, if any.
func (s *Server) fault(e Entry) (entryFault, bool) {
	if len(s.messageFaults) > 0 {
		if f, ok := s.messageFaults[e.MessageID()]; ok {
			return f, true
		}
	}
	for _, f := range s.entryFaults {
		if f.match(e) {
			return f, true
		}
	}
	return entryFault{}, false
}

// nextEventID is a fresh EventId in EventBridge's (UUID) format, from a
// counter: unique per server and cheap, where a random UUID per entry would
// cost the benchmark more than the publisher does.
func (s *Server) nextEventID() string {
	s.eventIDs++
	const prefix = "00000000-0000-4000-8000-000000000000"
	id := strconv.AppendUint(make([]byte, 0, len(prefix)), s.eventIDs, 16)
	return prefix[:len(prefix)-len(id)] + string(id)
}

// entrySize is AWS's PutEvents entry-size formula: the UTF-8 bytes of Source,
// DetailType, Detail and each Resources string, plus 14 when Time is set.
// It is written out here independently of the publisher's, so that each
// checks the other.
func entrySize(source, detailType, detail *string, hasTime bool, resources []string) int {
	n := len(deref(source)) + len(deref(detailType)) + len(deref(detail))
	if hasTime {
		n += 14
	}
	for _, r := range resources {
		n += len(r)
	}
	return n
}

// isJSONObject checks Detail as EventBridge does, without building the
// object: a fake that parsed every Detail would cost more than the
// publisher it measures.
func isJSONObject(s string) bool {
	t := strings.TrimLeft(s, " \t\r\n")
	return t != "" && t[0] == '{' && json.Valid([]byte(s))
}

// epochTime reads the wire's epoch seconds, kept to the millisecond the SDK
// sends.
func epochTime(sec float64) time.Time {
	whole, frac := math.Modf(sec)
	return time.Unix(int64(whole), int64(math.Round(frac*1e3))*int64(time.Millisecond)).UTC()
}

// signed reports whether r carries a SigV4 (or SigV4a, which PutEvents to
// a global endpoint uses) Authorization header, as every request of a
// client with credentials does.
func signed(r *http.Request) bool {
	auth := r.Header.Get("Authorization")
	return strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") || strings.HasPrefix(auth, "AWS4-ECDSA-P256-SHA256 ")
}

// writeError answers an error as AWS JSON 1.1 services do.
func writeError(w http.ResponseWriter, status int, errorType, message string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-RequestId", uuid.NewString())
	w.WriteHeader(status)
	w.Write(errorBody(errorType, message))
}

// errorBody is an AWS JSON 1.1 error: the type in "__type", the text in
// "message". The SDK also reads an X-Amzn-ErrorType header, which takes
// precedence when present; EventBridge answers with the body form.
func errorBody(errorType, message string) []byte {
	b, _ := json.Marshal(map[string]string{"__type": errorType, "message": message})
	return b
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// String summarises the server's state for test failure messages.
func (s *Server) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("eventbridgefake{requests: %d, accepted: %d, max in flight: %d}", s.requests, len(s.received), s.MaxInFlight())
}
