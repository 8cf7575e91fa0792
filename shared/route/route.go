package route

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/payloadschema"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
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
	FormatCloudEvents = cloudevent.Format
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

	outboxtype.GateOptions // circuit_breaker and rate_limit, which package dispatch applies
	schema                 *jsonschema.Schema
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
	Offload           Offload           `json:"-"`                             // the route's offload option, in the key: package offload applies it
	Format            string            `json:"-"`                             // the route's format option, "" or FormatCloudEvents, in the key
	CloudEventsSource string            `json:"-"`                             // format cloudevents: the source template, "" for the default

	key string
}

// Offload is a route's claim-check option as written, zero when unset (integers float64, as in decoding).
type Offload struct {
	Bucket         string  `json:"bucket"`
	ThresholdBytes float64 `json:"threshold_bytes"`
	Prefix         string  `json:"prefix"`
	KMSKeyID       string  `json:"kms_key_id"`
	URLTTL         string  `json:"url_ttl"`
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
		Timeout         string  `json:"timeout"`
		MaxPayloadBytes int     `json:"max_payload_bytes,omitempty"`
		Concurrency     int     `json:"concurrency,omitempty"`
		Offload         Offload `json:"offload,omitzero"`
		Format          string  `json:"format,omitempty"`
		Source          string  `json:"cloudevents_source,omitempty"`
	}{t, t.Timeout.String(), t.MaxPayloadBytes, t.Concurrency, t.Offload, t.Format, t.CloudEventsSource})
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

// PayloadError is a payload that fails its route's JSON Schema: the engine
// dead-letters the message with its text. It wraps ErrInvalidPayload.
type PayloadError = payloadschema.Error

// Violation is one schema rule a payload breaks.
type Violation = payloadschema.Violation

// ErrInvalidPayload is wrapped by every *PayloadError.
var ErrInvalidPayload = payloadschema.ErrInvalid

// maxViolations is how many violations a PayloadError lists.
const maxViolations = payloadschema.MaxViolations

// CheckPayload validates a payload against the route's JSON Schema, if it
// has one. The error is a *PayloadError naming each broken rule and where it
// broke, quoting no string of the payload (payloads are not logged).
func (r *Route) CheckPayload(payload []byte) error {
	if r.schema == nil {
		return nil
	}
	return payloadschema.Check(r.schema, r.Name, payload)
}
