package lambdaemu

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
)

// Lambda's payload limits: a RequestResponse request, and an Event's
// (raised from 256 KB to 1 MB in 2025).
const (
	MaxSyncPayloadBytes  = 6 << 20
	MaxAsyncPayloadBytes = 1 << 20
)

const (
	invokePathPrefix = "/2015-03-31/functions/"
	invokePathSuffix = "/invocations"
)

// serveInvokeAPI answers Lambda's Invoke operation as the real
// aws-sdk-go-v2 client calls it; its errors are written in Lambda's wire
// format by the same code as shared/testkit/awsfake/lambdafake's.
func (e *Emulator) serveInvokeAPI(w http.ResponseWriter, r *http.Request) {
	payload, readErr := io.ReadAll(io.LimitReader(r.Body, MaxSyncPayloadBytes+1))
	apiError := func(status int, typ, message string) {
		lambdafake.WriteAPIError(w, lambdafake.APIError{Status: status, Type: typ, Message: message})
	}
	switch {
	case readErr != nil:
		apiError(http.StatusBadRequest, "InvalidRequestContentException", "could not read the request body")
		return
	case !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 "):
		apiError(http.StatusForbidden, "MissingAuthenticationTokenException", "Missing Authentication Token")
		return
	case r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, invokePathPrefix) || !strings.HasSuffix(r.URL.Path, invokePathSuffix):
		apiError(http.StatusNotFound, "UnknownOperationException", "the emulator serves Invoke only, not "+r.Method+" "+r.URL.Path)
		return
	}
	rawName := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, invokePathPrefix), invokePathSuffix)
	name, err := resolveFunctionName(rawName, r.URL.Query().Get("Qualifier"))
	var f *function
	if err == nil {
		f, err = e.lookup(name)
	}
	var notFound *NotFoundError
	switch {
	case errors.As(err, &notFound):
		apiError(http.StatusNotFound, "ResourceNotFoundException", "Function not found: "+notFound.Function)
		return
	case err != nil:
		apiError(http.StatusServiceUnavailable, "ServiceException", err.Error())
		return
	}
	invocationType := InvocationType(r.Header.Get("X-Amz-Invocation-Type"))
	if invocationType == "" {
		invocationType = RequestResponse
	}
	limit := MaxSyncPayloadBytes
	if invocationType == Event {
		limit = MaxAsyncPayloadBytes
	}
	switch {
	case invocationType != RequestResponse && invocationType != Event && invocationType != "DryRun":
		apiError(http.StatusBadRequest, "InvalidParameterValueException", "X-Amz-Invocation-Type must be RequestResponse, Event or DryRun, got "+string(invocationType))
		return
	case len(payload) > limit:
		apiError(http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than "+strconv.Itoa(limit)+" bytes for the "+string(invocationType)+" invocation type")
		return
	case len(payload) > 0 && !json.Valid(payload):
		apiError(http.StatusBadRequest, "InvalidRequestContentException", "Could not parse request body into json")
		return
	}
	if len(payload) == 0 {
		payload = []byte("{}")
	}

	switch invocationType {
	case "DryRun":
		w.Header().Set("x-amzn-RequestId", newRequestID())
		w.WriteHeader(http.StatusNoContent)
	case Event:
		id, err := e.enqueue(f, payload, TriggerInvokeAPI)
		if err != nil {
			apiError(http.StatusServiceUnavailable, "ServiceException", err.Error())
			return
		}
		w.Header().Set("x-amzn-RequestId", id)
		w.WriteHeader(http.StatusAccepted)
	default:
		// The invocation runs to its end even if the caller hangs up, as
		// on Lambda: a client timeout does not stop the function.
		inv, err := e.invokeSync(f, payload, TriggerInvokeAPI)
		var throttled *ThrottledError
		switch {
		case errors.As(err, &throttled):
			lambdafake.WriteAPIError(w, lambdafake.APIError{Status: http.StatusTooManyRequests, Type: "TooManyRequestsException", Message: "Rate Exceeded.", Reason: throttled.Reason})
			return
		case err != nil:
			apiError(http.StatusServiceUnavailable, "ServiceException", err.Error())
			return
		}
		h := w.Header()
		h.Set("x-amzn-RequestId", inv.RequestID)
		h.Set("Content-Type", "application/json")
		h.Set("X-Amz-Executed-Version", "$LATEST")
		if inv.Outcome != OutcomeSucceeded {
			h.Set("X-Amz-Function-Error", "Unhandled")
		}
		w.WriteHeader(http.StatusOK)
		w.Write(inv.Response)
	}
}
