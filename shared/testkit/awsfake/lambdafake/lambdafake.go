// Package lambdafake is a wire-level test double of the AWS Lambda Invoke
// REST API, for tests that drive the real aws-sdk-go-v2 lambda client:
//
//	POST /2015-03-31/functions/{FunctionName}/invocations[?Qualifier=…]
//	X-Amz-Invocation-Type: RequestResponse | Event | DryRun
//	X-Amz-Log-Type: None | Tail
//	Authorization: AWS4-HMAC-SHA256 …  (required, not verified)
//
// answered as Lambda does: the function's response as the body, with
// X-Amz-Executed-Version, x-amzn-RequestId, X-Amz-Function-Error when the
// function failed and X-Amz-Log-Result (base64) when a tail was asked for;
// API errors with X-Amzn-ErrorType and a JSON body, Retry-After on
// throttles. Functions are registered with Handle; an unknown one is a 404
// ResourceNotFoundException. FailCalls, SetLatency, Stall and Resume
// inject failures.
package lambdafake

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/faults"
)

// Region is the region Config names.
const Region = "us-east-1"

// Handler is a fake function: it gets the invocation's payload (the
// envelope) and returns the HTTP status (0 means 200), the response body
// and, when the function failed, the X-Amz-Function-Error value
// ("Unhandled") with body {"errorType":…,"errorMessage":…}.
type Handler func(envelope []byte) (status int, body []byte, functionError string)

// Invocation is one call the server received.
type Invocation struct {
	Function       string
	Qualifier      string
	InvocationType string
	Payload        []byte
}

// APIError is an injected Invoke API error.
type APIError struct {
	// Status is the HTTP status, e.g. 429.
	Status int
	// Type is the X-Amzn-ErrorType, e.g. "TooManyRequestsException".
	Type string
	// Message is the error's message (default: the type).
	Message string
	// RetryAfter, when set, is sent as the Retry-After header.
	RetryAfter string
	// Reason, when set, is the body's "Reason", e.g. a throttle's
	// "ReservedFunctionConcurrentInvocationLimitExceeded".
	Reason string
}

// Server is a running fake, closed when the test ends.
type Server struct {
	srv *httptest.Server
	// SetLatency, Stall and Resume.
	faults.Controls

	mu          sync.Mutex
	functions   map[string]Handler
	requests    int
	invocations []Invocation
	failures    []APIError // one per call to fail, in order
}

// New starts a fake for t.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{functions: map[string]Handler{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		faults.Release(&s.Controls) // or Close would wait for the held calls
		s.srv.Close()
	})
	return s
}

// URL is the server's endpoint.
func (s *Server) URL() string { return s.srv.URL }

// Config is an SDK configuration that sends Lambda calls to this server,
// with static credentials and no SDK retries, so that every Invoke is one
// request the test can count. Tests that want the SDK's retries set their
// own Retryer.
func (s *Server) Config() aws.Config {
	return aws.Config{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDLAMBDAFAKE", "lambdafake-secret", ""),
		BaseEndpoint: aws.String(s.srv.URL),
		Retryer:      func() aws.Retryer { return aws.NopRetryer{} },
	}
}

// Handle registers function (as the caller names it: a name, an ARN, or
// either with ":qualifier") with h.
func (s *Server) Handle(function string, h Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.functions[function] = h
}

// Requests is the number of HTTP requests received, failed ones included.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Invocations returns the invocations that reached a function.
func (s *Server) Invocations() []Invocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Invocation(nil), s.invocations...)
}

// FailCalls makes the next n calls fail with an API error of status and
// errorType.
func (s *Server) FailCalls(n, status int, errorType string) {
	s.FailCallsWith(n, APIError{Status: status, Type: errorType})
}

// FailCallsWith makes the next n calls fail with e.
func (s *Server) FailCallsWith(n int, e APIError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.failures = append(s.failures, e)
	}
}

const (
	pathPrefix = "/2015-03-31/functions/"
	pathSuffix = "/invocations"
)

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	payload, readErr := io.ReadAll(r.Body)

	s.mu.Lock()
	s.requests++
	var failure *APIError
	if len(s.failures) > 0 {
		failure = &s.failures[0]
		s.failures = s.failures[1:]
	}
	s.mu.Unlock()

	if !faults.Wait(r.Context(), &s.Controls, arrived) {
		return // the caller gave up, or the test ended
	}

	switch {
	case readErr != nil:
		WriteAPIError(w, APIError{Status: http.StatusBadRequest, Type: "InvalidRequestContentException", Message: "could not read the request body"})
		return
	case !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 "):
		WriteAPIError(w, APIError{Status: http.StatusForbidden, Type: "MissingAuthenticationTokenException", Message: "Missing Authentication Token"})
		return
	case r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, pathPrefix) || !strings.HasSuffix(r.URL.Path, pathSuffix):
		WriteAPIError(w, APIError{Status: http.StatusNotFound, Type: "UnknownOperationException", Message: r.Method + " " + r.URL.Path})
		return
	case failure != nil:
		WriteAPIError(w, *failure)
		return
	}

	function := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, pathPrefix), pathSuffix)
	qualifier := r.URL.Query().Get("Qualifier")
	name := function
	if qualifier != "" {
		name += ":" + qualifier
	}
	s.mu.Lock()
	h, ok := s.functions[name]
	s.mu.Unlock()
	if !ok {
		WriteAPIError(w, APIError{Status: http.StatusNotFound, Type: "ResourceNotFoundException",
			Message: "Function not found: " + name})
		return
	}
	invocationType := r.Header.Get("X-Amz-Invocation-Type")
	if invocationType == "" {
		invocationType = "RequestResponse"
	}
	if !json.Valid(payload) && len(payload) > 0 {
		WriteAPIError(w, APIError{Status: http.StatusBadRequest, Type: "InvalidRequestContentException",
			Message: "Could not parse request body into json"})
		return
	}
	requestID := uuid.NewString()
	w.Header().Set("x-amzn-RequestId", requestID)
	if invocationType == "DryRun" {
		w.WriteHeader(http.StatusNoContent)
		return
	}

	s.mu.Lock()
	s.invocations = append(s.invocations, Invocation{Function: function, Qualifier: qualifier, InvocationType: invocationType, Payload: payload})
	s.mu.Unlock()
	status, body, functionError := h(payload)

	if invocationType == "Event" {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if status == 0 {
		status = http.StatusOK
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amz-Executed-Version", "$LATEST")
	if functionError != "" {
		w.Header().Set("X-Amz-Function-Error", functionError)
	}
	if r.Header.Get("X-Amz-Log-Type") == "Tail" {
		log := fmt.Sprintf("START RequestId: %s Version: $LATEST\nEND RequestId: %s\n", requestID, requestID)
		w.Header().Set("X-Amz-Log-Result", base64.StdEncoding.EncodeToString([]byte(log)))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// WriteAPIError answers as Lambda does: the error type in X-Amzn-ErrorType
// (with Lambda's ":<namespace>" suffix, which the SDK strips) and a JSON
// body. Other emulations of the Invoke API (shared/testkit/lambdaemu)
// answer their errors with it too.
func WriteAPIError(w http.ResponseWriter, e APIError) {
	if e.Message == "" {
		e.Message = e.Type
	}
	doc := map[string]string{"Type": "User", "message": e.Message}
	if e.Reason != "" {
		doc["Reason"] = e.Reason
	}
	body, _ := json.Marshal(doc)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-ErrorType", e.Type+":http://internal.amazon.com/coral/com.amazonaws.lambda/")
	w.Header().Set("x-amzn-RequestId", uuid.NewString())
	if e.RetryAfter != "" {
		w.Header().Set("Retry-After", e.RetryAfter)
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(body)
}
