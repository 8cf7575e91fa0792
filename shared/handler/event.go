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

// scheduleEnvelope is an EventBridge event (a scheduled rule, or a
// Scheduler target that forwards one). Its detail, when present, carries the
// function's own fields.
var scheduleEnvelopeFields = map[string]bool{
	"version": true, "id": true, "detail-type": true, "source": true, "account": true,
	"time": true, "region": true, "resources": true, "detail": true,
}

// DecodeEvent decodes raw into v strictly — an unknown field is an error,
// since a misspelt filter must not silently widen a replay — accepting an
// empty event, null, {} and an EventBridge envelope whose detail holds the
// fields.
func DecodeEvent(function string, raw []byte, v any) error {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil
	}
	if trimmed[0] != '{' {
		return &EventError{Function: function, Problem: "the event must be a JSON object"}
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &probe); err != nil {
		return &EventError{Function: function, Problem: "not valid JSON: " + err.Error()}
	}
	if _, isEnvelope := probe["detail-type"]; isEnvelope {
		for k := range probe {
			if !scheduleEnvelopeFields[k] {
				return &EventError{Function: function, Problem: fmt.Sprintf("unknown field %q in an EventBridge event", k)}
			}
		}
		detail := probe["detail"]
		if len(bytes.TrimSpace(detail)) == 0 {
			return nil
		}
		return DecodeEvent(function, detail, v)
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
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
