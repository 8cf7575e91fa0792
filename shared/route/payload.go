package route

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

// maxViolations caps the violations a PayloadError lists: the first few say
// what is wrong; a hundred would bury it.
const maxViolations = 5

// maxViolationMessage caps one violation's message (an enum of a thousand
// values would otherwise be repeated in full).
const maxViolationMessage = 200

var printer = message.NewPrinter(language.English)

// errRemoteRef is what loading any schema that is not inline fails with.
var errRemoteRef = errors.New("references outside the route's own schema are not loaded; put the referenced schema under $defs and use \"$ref\": \"#/$defs/<name>\"")

// noRemoteLoader refuses every URL. The library's default loader reads
// local files; a route's schema must be self-contained, so that a cold
// start never depends on a network or a file system.
type noRemoteLoader struct{}

func (noRemoteLoader) Load(string) (any, error) { return nil, errRemoteRef }

// compileSchema compiles a route's schema (draft 2020-12 unless it says
// otherwise) and returns it with its canonical JSON: compact, keys sorted.
func compileSchema(raw json.RawMessage, index int) (*jsonschema.Schema, json.RawMessage, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("is not valid JSON: %v", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // keep "<" in a pattern readable
	if err := enc.Encode(doc); err != nil {
		return nil, nil, fmt.Errorf("cannot be encoded: %v", err)
	}
	canonical := json.RawMessage(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	loc := fmt.Sprintf("https://outboxkit.invalid/routes/%d/schema.json", index)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noRemoteLoader{})
	if err := c.AddResource(loc, doc); err != nil {
		return nil, nil, fmt.Errorf("cannot be added: %v", err)
	}
	sch, err := c.Compile(loc)
	if err != nil {
		return nil, nil, compileError(err, loc)
	}
	return sch, canonical, nil
}

// compileError flattens the library's error, which is a multi-line tree
// when the schema breaks its metaschema, to one line without the internal
// location the schema was compiled under.
func compileError(err error, loc string) error {
	if sve, ok := errors.AsType[*jsonschema.SchemaValidationError](err); ok {
		if ve, ok := errors.AsType[*jsonschema.ValidationError](sve.Err); ok {
			var vs []Violation
			collectViolations(ve, &vs, false)
			parts := make([]string, len(vs))
			for i, v := range vs {
				at := v.InstanceLocation
				if at == "" {
					at = "/"
				}
				parts[i] = fmt.Sprintf("at %s: %s", at, v.Message)
			}
			return fmt.Errorf("is not a valid JSON Schema: %s", strings.Join(parts, "; "))
		}
	}
	// The location is made up; a relative reference reads best as written.
	msg := strings.ReplaceAll(err.Error(), loc+"#", "#")
	msg = strings.ReplaceAll(msg, loc, "the schema")
	msg = strings.ReplaceAll(msg, loc[:strings.LastIndexByte(loc, '/')+1], "")
	return fmt.Errorf("does not compile: %s", strings.Join(strings.Fields(msg), " "))
}

// CheckPayload validates a payload against the route's JSON Schema; nil
// when the route has none or the payload conforms. The error is a
// *PayloadError (wrapping ErrInvalidPayload) that names each broken rule
// and where in the payload it broke. It quotes no string from the payload
// (payloads are not logged), though it may give numbers and property names.
func (r *Route) CheckPayload(payload []byte) error {
	if r.schema == nil {
		return nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &PayloadError{Violations: []Violation{{Message: fmt.Sprintf("the payload is not valid JSON: %v", err)}}}
	}
	err = r.schema.Validate(doc)
	if err == nil {
		return nil
	}
	ve, ok := errors.AsType[*jsonschema.ValidationError](err)
	if !ok {
		return fmt.Errorf("route: validating the payload against %s's schema: %w", r.Name, err)
	}
	var all []Violation
	collectViolations(ve, &all, true)
	slices.SortStableFunc(all, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.InstanceLocation, b.InstanceLocation), cmp.Compare(a.KeywordLocation, b.KeywordLocation))
	})
	pe := &PayloadError{Violations: all}
	if len(all) > maxViolations {
		pe.Violations, pe.More = all[:maxViolations], len(all)-maxViolations
	}
	return pe
}

// collectViolations gathers the leaves of a validation error tree: the
// inner nodes ("allOf failed", "$ref failed") only say that a leaf did.
// redact leaves out the strings of the instance (see violationMessage).
func collectViolations(e *jsonschema.ValidationError, out *[]Violation, redact bool) {
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			collectViolations(c, out, redact)
		}
		return
	}
	_, fragment, _ := strings.Cut(e.SchemaURL, "#")
	keyword := fragment + pointer(e.ErrorKind.KeywordPath())
	*out = append(*out, Violation{
		InstanceLocation: pointer(e.InstanceLocation),
		KeywordLocation:  cmp.Or(keyword, "/"),
		Message:          violationMessage(e.ErrorKind, redact),
	})
}

// violationMessage describes a broken rule without quoting the payload's
// strings, which can hold personal data.
func violationMessage(k jsonschema.ErrorKind, redact bool) string {
	var msg string
	switch k := k.(type) {
	case *kind.Pattern:
		if redact {
			msg = fmt.Sprintf("does not match the pattern %q", k.Want)
		}
	case *kind.Format:
		if redact {
			msg = fmt.Sprintf("is not a valid %s", k.Want)
		}
	}
	if msg == "" {
		msg = strings.Join(strings.Fields(k.LocalizedString(printer)), " ")
	}
	if len(msg) > maxViolationMessage {
		msg = strings.ToValidUTF8(msg[:maxViolationMessage], "") + "…"
	}
	return msg
}

// pointer renders tokens as a JSON Pointer (RFC 6901).
func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}
