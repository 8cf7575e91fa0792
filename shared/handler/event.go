package handler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// EventError is a malformed invocation event. Nothing was changed. Its Go
// type name is what the Lambda runtime reports as errorType.
type EventError struct {
	Function string
	Problem  string
}

func (e *EventError) Error() string {
	return fmt.Sprintf("%s: malformed event: %s", e.Function, e.Problem)
}

// scheduleEnvelopeFields are the fields of an EventBridge event (a
// scheduled rule, or a Scheduler target that forwards one). Its detail, when
// present, carries the function's own fields.
var scheduleEnvelopeFields = map[string]bool{
	"version": true, "id": true, "detail-type": true, "source": true, "account": true,
	"time": true, "region": true, "resources": true, "detail": true,
}

// DecodeEvent decodes raw into v strictly — an unknown field is an error,
// since a misspelt filter must not silently widen a replay — accepting an
// empty event, null, {} and one EventBridge envelope whose detail holds the
// fields (or is absent, null or {}).
//
// Exactly one envelope level is accepted: an envelope inside detail is
// refused rather than unwrapped, so an event is read a fixed number of times
// whatever its nesting (unwrapping level by level re-read the rest of the
// event at every level, and a 261 KB event of nested envelopes took 27 s of
// CPU).
func DecodeEvent(function string, raw []byte, v any) error {
	event, err := probeEvent(function, raw)
	if err != nil || event == nil {
		return err
	}
	if _, isEnvelope := event["detail-type"]; !isEnvelope {
		return decodeFields(function, raw, v)
	}
	for k := range event {
		if !scheduleEnvelopeFields[k] {
			return &EventError{Function: function, Problem: fmt.Sprintf("unknown field %q in an EventBridge event", k)}
		}
	}
	detail, err := probeEvent(function, event["detail"])
	if err != nil || detail == nil {
		return err
	}
	if _, isEnvelope := detail["detail-type"]; isEnvelope {
		return &EventError{Function: function, Problem: "detail holds another EventBridge event; only one envelope level is accepted"}
	}
	return decodeFields(function, event["detail"], v)
}

// probeEvent reads the top level of a JSON object: nil for an empty event or
// null, an EventError for anything but an object.
func probeEvent(function string, raw []byte) (map[string]json.RawMessage, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil, nil
	}
	if trimmed[0] != '{' {
		return nil, &EventError{Function: function, Problem: "the event must be a JSON object"}
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &probe); err != nil {
		return nil, &EventError{Function: function, Problem: "not valid JSON: " + err.Error()}
	}
	return probe, nil
}

// decodeFields decodes the function's own object, which probeEvent has
// found to be one JSON object, into v, refusing unknown fields.
func decodeFields(function string, raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(bytes.TrimSpace(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &EventError{Function: function, Problem: describeJSONError(err)}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &EventError{Function: function, Problem: "unexpected data after the JSON object"}
	}
	return nil
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Sprintf("field %q must be %s, got a JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown field " + rest
	}
	return msg
}
