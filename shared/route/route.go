package route

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/gate"
)

// Wildcard is the match pattern that matches every namespace or topic.
const Wildcard = "*"

// The on_dead and on_config_error policies, and the target types.
const (
	OnDeadSkip        = "skip"
	OnDeadPark        = "park"
	OnConfigErrorHold = "hold"
	OnConfigErrorDead = "dead"
	TypeSNS           = "sns"
	TypeEventBridge   = "eventbridge"
	TypeHTTP          = "http"
	TypeLambda        = "lambda"
)

// Table is a validated routing configuration, built by Parse; it is
// immutable and safe for concurrent use.
type Table struct {
	Routes []*Route // in configuration order; Routes[i].Index == i

	exact       map[Match]*Route  // namespace and topic exact
	byNamespace map[string]*Route // namespace exact, topic "*"
	byTopic     map[string]*Route // namespace "*", topic exact
	fallback    *Route            // "*" and "*"
}

// Match returns the most specific route for a message (exact namespace and
// topic, then exact namespace, then exact topic, then "*" and "*"), nil
// when none matches. It is O(1) and does not allocate.
func (t *Table) Match(namespace, topic string) *Route {
	if r := t.exact[Match{namespace, topic}]; r != nil {
		return r
	}
	if r := t.byNamespace[namespace]; r != nil {
		return r
	}
	if r := t.byTopic[topic]; r != nil {
		return r
	}
	return t.fallback
}

// index builds the lookup maps of routes with distinct patterns.
func (t *Table) index() {
	t.exact, t.byNamespace, t.byTopic = map[Match]*Route{}, map[string]*Route{}, map[string]*Route{}
	for _, r := range t.Routes {
		switch ns, tp := r.Match.Namespace, r.Match.Topic; {
		case ns != Wildcard && tp != Wildcard:
			t.exact[r.Match] = r
		case ns != Wildcard:
			t.byNamespace[ns] = r
		case tp != Wildcard:
			t.byTopic[tp] = r
		default:
			t.fallback = r
		}
	}
}

// Targets returns the distinct targets of the table (by Key), in the order
// of the first route that uses each: build one publisher per target.
func (t *Table) Targets() []Target {
	var out []Target
	for _, r := range t.Routes {
		if !slices.ContainsFunc(out, func(o Target) bool { return o.Key() == r.Target.Key() }) {
			out = append(out, r.Target)
		}
	}
	return out
}

// Match is a route's pattern: each field is an exact name or "*".
type Match struct {
	Namespace string `json:"namespace"`
	Topic     string `json:"topic"`
}

// Matches reports whether the pattern matches a namespace and topic.
func (m Match) Matches(namespace, topic string) bool {
	return (m.Namespace == Wildcard || m.Namespace == namespace) && (m.Topic == Wildcard || m.Topic == topic)
}

// String renders the pattern as namespace/topic.
func (m Match) String() string { return m.Namespace + "/" + m.Topic }

// Route sends the messages its pattern matches to one target under one
// delivery policy. Fields tagged json are decoded as written.
type Route struct {
	Index  int            `json:"-"`    // the route's position in the configuration
	Name   string         `json:"name"` // the configured name, else "routes[<index>]": for logs, metrics and dead-letter reasons
	Match  Match          `json:"match"`
	Target Target         `json:"-"`
	Retry  backoff.Policy `json:"-"` // each field absent from the configuration is backoff.Default's
	// Timeout bounds each call to the target; MaxPayloadBytes is the
	// largest payload the route sends, in bytes of its JSON (a larger one
	// is dead-lettered as PAYLOAD_TOO_LARGE without a call).
	Timeout         time.Duration   `json:"-"`
	MaxPayloadBytes int             `json:"-"`
	Schema          json.RawMessage `json:"schema"`          // the payload's JSON Schema as canonical JSON, nil when none is set
	OnDead          string          `json:"on_dead"`         // OnDeadSkip or OnDeadPark: what an ordered message's death does to its key
	OnConfigError   string          `json:"on_config_error"` // OnConfigErrorHold or OnConfigErrorDead: what a target's configuration failure does to a message

	gate.RouteOptions // circuit_breaker and rate_limit, which package dispatch applies
	schema            *jsonschema.Schema
}

// HasSchema reports whether the route validates payloads against a schema.
func (r *Route) HasSchema() bool { return r.schema != nil }

// Target is where a route delivers; only the fields of its Type are set.
type Target struct {
	Type string `json:"type"` // "sns", "eventbridge", "http" or "lambda"
	// Timeout and MaxPayloadBytes repeat the route's, so that a publisher
	// built from a Target alone has them. Concurrency is the calls to the
	// target in flight at once within a batch: for the per-message targets
	// (http, lambda) it bounds throughput to concurrency / call latency.
	Timeout         time.Duration `json:"-"`
	MaxPayloadBytes int           `json:"-"`
	Concurrency     int           `json:"-"`

	TopicARN          string            `json:"topic_arn,omitempty"`           // sns
	MessageGroupID    string            `json:"message_group_id,omitempty"`    // sns, FIFO only: the group of messages without an ordering key
	EventBus          string            `json:"event_bus,omitempty"`           // eventbridge: a bus name or ARN
	Source            string            `json:"source,omitempty"`              // eventbridge: a template, see ExpandTemplate
	DetailType        string            `json:"detail_type,omitempty"`         // eventbridge: a template
	URL               string            `json:"url,omitempty"`                 // http
	SigningSecretEnv  string            `json:"signing_secret_env,omitempty"`  // http: the variable holding the signing secret, or
	SigningSecretARN  string            `json:"signing_secret_arn,omitempty"`  // http: the secret's Secrets Manager ARN
	Headers           map[string]string `json:"headers,omitempty"`             // http: static extra headers
	AllowInsecureHTTP bool              `json:"allow_insecure_http,omitempty"` // http: http:// to hosts other than loopback
	Function          string            `json:"function,omitempty"`            // lambda: a name, partial or full ARN, with an optional :qualifier

	key string
}

// Key is the target's identity: routes whose targets have equal keys share
// one publisher. It covers every field, so targets that differ in anything
// (a header, a secret, the timeout) get separate publishers.
func (t Target) Key() string {
	if t.key != "" {
		return t.key
	}
	return t.computeKey()
}

// computeKey writes the target as JSON, unambiguous whatever the values
// contain (the field order is fixed, map keys sorted) and readable in logs.
func (t Target) computeKey() string {
	b, err := json.Marshal(struct {
		Target
		Timeout         string `json:"timeout"`
		MaxPayloadBytes int    `json:"max_payload_bytes,omitempty"`
		Concurrency     int    `json:"concurrency,omitempty"`
	}{t, t.Timeout.String(), t.MaxPayloadBytes, t.Concurrency})
	if err != nil {
		panic("route: marshalling a target key: " + err.Error()) // strings, bools, ints and a string map always marshal
	}
	return string(b)
}

// IsFIFO reports whether the target is an SNS FIFO topic (a ".fifo" name).
func (t Target) IsFIFO() bool { return t.Type == TypeSNS && strings.HasSuffix(t.TopicARN, ".fifo") }

// The placeholders of EventBridge source and detail-type templates.
const (
	PlaceholderNamespace = "{namespace}"
	PlaceholderTopic     = "{topic}"
)

// ExpandTemplate replaces {namespace} and {topic} in an EventBridge template.
func ExpandTemplate(template, namespace, topic string) string {
	return strings.NewReplacer(PlaceholderNamespace, namespace, PlaceholderTopic, topic).Replace(template)
}

// ErrInvalidPayload is wrapped by every *PayloadError.
var ErrInvalidPayload = errors.New("route: payload fails the route's schema")

// PayloadError is a payload that fails its route's JSON Schema: the engine
// dead-letters the message with its text.
type PayloadError struct {
	Violations []Violation // the rules the payload breaks, at most maxViolations
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
func (e *PayloadError) Error() string {
	parts := make([]string, 0, len(e.Violations)+1)
	for _, v := range e.Violations {
		parts = append(parts, v.String())
	}
	if e.More > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", e.More))
	}
	return strings.Join(parts, "; ")
}

// Unwrap makes errors.Is(err, ErrInvalidPayload) true.
func (e *PayloadError) Unwrap() error { return ErrInvalidPayload }

// A PayloadError lists the first violations (a hundred would bury what is
// wrong), each capped (an enum of a thousand values would be repeated).
const maxViolations, maxViolationMessage = 5, 200

var printer = message.NewPrinter(language.English)

// noRemoteLoader refuses every URL: a route's schema is self-contained, so
// that a cold start never depends on a network or a file system.
type noRemoteLoader struct{}

func (noRemoteLoader) Load(string) (any, error) {
	return nil, errors.New(`references outside the route's own schema are not loaded; put the referenced schema under $defs and use "$ref": "#/$defs/<name>"`)
}

// compileSchema compiles a route's schema (draft 2020-12 but for $schema).
func compileSchema(raw json.RawMessage, index int) (*jsonschema.Schema, error) {
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

// CheckPayload validates a payload against the route's JSON Schema, if it
// has one. The error is a *PayloadError naming each broken rule and where it
// broke, quoting no string of the payload (payloads are not logged).
func (r *Route) CheckPayload(payload []byte) error {
	if r.schema == nil {
		return nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &PayloadError{Violations: []Violation{{Message: fmt.Sprintf("the payload is not valid JSON: %v", err)}}}
	}
	if err = r.schema.Validate(doc); err == nil {
		return nil
	}
	ve, ok := errors.AsType[*jsonschema.ValidationError](err)
	if !ok {
		return fmt.Errorf("route: validating the payload against %s's schema: %w", r.Name, err)
	}
	all := collectViolations(ve, nil, true)
	slices.SortStableFunc(all, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.InstanceLocation, b.InstanceLocation), cmp.Compare(a.KeywordLocation, b.KeywordLocation))
	})
	pe := &PayloadError{Violations: all}
	if len(all) > maxViolations {
		pe.Violations, pe.More = all[:maxViolations], len(all)-maxViolations
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
	msg := strings.Join(strings.Fields(e.ErrorKind.LocalizedString(printer)), " ")
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
	return append(out, Violation{pointer(e.InstanceLocation), cmp.Or(fragment+pointer(e.ErrorKind.KeywordPath()), "/"), msg})
}

// pointer renders tokens as a JSON Pointer (RFC 6901).
func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString("/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}
