// Package payloadschema compiles a route's payload JSON Schema and checks
// payloads against it, naming each broken rule without quoting the payload.
package payloadschema

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// ErrInvalid is wrapped by every *Error.
var ErrInvalid = errors.New("route: payload fails the route's schema")

// Error is a payload that fails its route's JSON Schema: the engine
// dead-letters the message with its text.
type Error struct {
	Violations []Violation // the rules the payload breaks, at most MaxViolations
	More       int         // the violations left out of Violations
}

// Violation is one schema rule a payload breaks.
type Violation struct {
	InstanceLocation string // the JSON Pointer of the offending value; "" is the payload itself
	KeywordLocation  string // the JSON Pointer of the rule in the schema, such as "/properties/amount/minimum"
	Message          string // what is wrong, such as "missing property 'tenant_id'"
}

// String renders the violation as "at <location>: <message> (schema rule
// <keyword location>)".
func (v Violation) String() string { return v.at() + " (schema rule " + v.KeywordLocation + ")" }

func (v Violation) at() string { return "at " + cmp.Or(v.InstanceLocation, "/") + ": " + v.Message }

// Error lists the violations on one line, separated by semicolons.
func (e *Error) Error() string {
	parts := make([]string, 0, len(e.Violations)+1)
	for _, v := range e.Violations {
		parts = append(parts, v.String())
	}
	if e.More > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", e.More))
	}
	return strings.Join(parts, "; ")
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *Error) Unwrap() error { return ErrInvalid }

// An Error lists the first violations (a hundred would bury what is
// wrong), each capped (an enum of a thousand values would be repeated).
const MaxViolations, maxViolationMessage = 5, 200

// Printer renders the library's messages in English.
var Printer = message.NewPrinter(language.English)

// noRemoteLoader refuses every URL: a route's schema is self-contained, so
// that a cold start never depends on a network or a file system.
type noRemoteLoader struct{}

func (noRemoteLoader) Load(string) (any, error) {
	return nil, errors.New(`references outside the route's own schema are not loaded; put the referenced schema under $defs and use "$ref": "#/$defs/<name>"`)
}

// Compile compiles a route's payload schema (draft 2020-12 but for
// $schema); index, the route's, names its made-up location.
func Compile(raw json.RawMessage, index int) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	loc := fmt.Sprintf("https://outboxkit.invalid/routes/%d/schema.json", index)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noRemoteLoader{})
	if err == nil {
		err = c.AddResource(loc, doc)
	}
	var sch *jsonschema.Schema
	if err == nil {
		sch, err = c.Compile(loc)
	}
	var ve *jsonschema.ValidationError
	if sve, ok := errors.AsType[*jsonschema.SchemaValidationError](err); ok {
		ve, _ = sve.Err.(*jsonschema.ValidationError)
	}
	switch {
	case ve != nil: // it breaks its metaschema; the library's error is a multi-line tree
		var parts []string
		for _, v := range collectViolations(ve, nil, false) {
			parts = append(parts, v.at())
		}
		return nil, fmt.Errorf("is not a valid JSON Schema: %s", strings.Join(parts, "; "))
	case err != nil: // the location is made up: a reference reads best as written
		msg := strings.NewReplacer(loc+"#", "#", loc, "the schema", loc[:strings.LastIndexByte(loc, '/')+1], "").Replace(err.Error())
		return nil, fmt.Errorf("does not compile: %s", strings.Join(strings.Fields(msg), " "))
	}
	return sch, nil
}

// Check validates a payload against the schema of the route named name.
// The error is an *Error naming each broken rule and where it
// broke, quoting no string of the payload (payloads are not logged).
func Check(schema *jsonschema.Schema, name string, payload []byte) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &Error{Violations: []Violation{{Message: fmt.Sprintf("the payload is not valid JSON: %v", err)}}}
	}
	if err = schema.Validate(doc); err == nil {
		return nil
	}
	ve, ok := errors.AsType[*jsonschema.ValidationError](err)
	if !ok {
		return fmt.Errorf("route: validating the payload against %s's schema: %w", name, err)
	}
	all := collectViolations(ve, nil, true)
	slices.SortStableFunc(all, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.InstanceLocation, b.InstanceLocation), cmp.Compare(a.KeywordLocation, b.KeywordLocation))
	})
	pe := &Error{Violations: all}
	if len(all) > MaxViolations {
		pe.Violations, pe.More = all[:MaxViolations], len(all)-MaxViolations
	}
	return pe
}

// collectViolations gathers the leaves of a validation error tree (the
// inner nodes only say that a leaf failed); redact leaves out the strings.
func collectViolations(e *jsonschema.ValidationError, out []Violation, redact bool) []Violation {
	for _, c := range e.Causes {
		out = collectViolations(c, out, redact)
	}
	if len(e.Causes) > 0 {
		return out
	}
	msg := strings.Join(strings.Fields(e.ErrorKind.LocalizedString(Printer)), " ")
	switch k := e.ErrorKind.(type) {
	case *kind.Pattern:
		if redact {
			msg = fmt.Sprintf("does not match the pattern %q", k.Want)
		}
	case *kind.Format:
		if redact {
			msg = fmt.Sprintf("is not a valid %s", k.Want)
		}
	}
	if len(msg) > maxViolationMessage {
		msg = strings.ToValidUTF8(msg[:maxViolationMessage], "") + "…"
	}
	_, fragment, _ := strings.Cut(e.SchemaURL, "#")
	return append(out, Violation{Pointer(e.InstanceLocation), cmp.Or(fragment+Pointer(e.ErrorKind.KeywordPath()), "/"), msg})
}

// pointerEscapes escapes a JSON Pointer's reference token. A Replacer
// builds its lookup at its first use: one for the process, not one a token.
var pointerEscapes = strings.NewReplacer("~", "~0", "/", "~1")

// Pointer renders tokens as a JSON Pointer (RFC 6901).
func Pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(pointerEscapes.Replace(t))
	}
	return b.String()
}
