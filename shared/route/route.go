package route

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxkit/dispatcher/shared/backoff"
)

// Wildcard is the match pattern that matches every namespace or topic.
const Wildcard = "*"

// The on_dead policies.
const (
	OnDeadSkip = "skip"
	OnDeadPark = "park"
)

// The on_config_error policies.
const (
	OnConfigErrorHold = "hold"
	OnConfigErrorDead = "dead"
)

// The target types.
const (
	TypeSNS         = "sns"
	TypeEventBridge = "eventbridge"
	TypeHTTP        = "http"
	TypeLambda      = "lambda"
)

// Table is a validated routing configuration. Build it with Parse: it also
// builds the lookup maps that Match uses. A Table is
// immutable and safe for concurrent use.
type Table struct {
	// Routes are the routes in configuration order; Routes[i].Index == i.
	Routes []*Route

	exact       map[namePair]*Route // namespace and topic exact
	byNamespace map[string]*Route   // namespace exact, topic "*"
	byTopic     map[string]*Route   // namespace "*", topic exact
	fallback    *Route              // "*" and "*"
}

type namePair struct{ namespace, topic string }

// Match returns the most specific route for a message, or nil when no route
// matches (the engine dead-letters the message as NO_ROUTE). Precedence:
// exact namespace and exact topic, then exact namespace and "*", then "*"
// and exact topic, then "*" and "*"; an exact namespace outranks an exact
// topic. Match is O(1) and does not allocate.
func (t *Table) Match(namespace, topic string) *Route {
	if r := t.exact[namePair{namespace, topic}]; r != nil {
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

// index builds the lookup maps. The routes are already known to have
// distinct match patterns.
func (t *Table) index() {
	t.exact = map[namePair]*Route{}
	t.byNamespace = map[string]*Route{}
	t.byTopic = map[string]*Route{}
	for _, r := range t.Routes {
		ns, tp := r.Match.Namespace, r.Match.Topic
		switch {
		case ns != Wildcard && tp != Wildcard:
			t.exact[namePair{ns, tp}] = r
		case ns != Wildcard:
			t.byNamespace[ns] = r
		case tp != Wildcard:
			t.byTopic[tp] = r
		default:
			t.fallback = r
		}
	}
}

// Match is a route's pattern: each of Namespace and Topic is an exact name
// or "*".
type Match struct {
	Namespace string
	Topic     string
}

// Matches reports whether the pattern matches a message's namespace and
// topic.
func (m Match) Matches(namespace, topic string) bool {
	return (m.Namespace == Wildcard || m.Namespace == namespace) &&
		(m.Topic == Wildcard || m.Topic == topic)
}

// String renders the pattern as namespace/topic.
func (m Match) String() string { return m.Namespace + "/" + m.Topic }

// Route sends the messages its pattern matches to one target under one
// delivery policy.
type Route struct {
	// Index is the route's position in the configuration.
	Index int
	// Name is the configured "name", else "routes[<index>]"; it names the
	// route in logs, metrics and dead-letter reasons.
	Name string
	// Match is the route's pattern.
	Match Match
	// Target is where the messages go.
	Target Target
	// Retry is the route's retry policy; each field absent from the
	// configuration is backoff.Default's.
	Retry backoff.Policy
	// Timeout bounds each call to the target (target.timeout; default
	// DefaultTimeout, at most MaxTimeout).
	Timeout time.Duration
	// MaxPayloadBytes is the largest payload the route sends, in bytes of
	// the payload's JSON; a larger one is dead-lettered as
	// PAYLOAD_TOO_LARGE without a call. The default and the hard maximum
	// depend on the target type (routes.schema.json).
	MaxPayloadBytes int
	// Schema is the configured JSON Schema, nil when the route has none.
	Schema json.RawMessage
	// OnDead is what happens to an ordered message's key when the message
	// dies (on_dead): OnDeadSkip lets the key's next message go, OnDeadPark
	// holds the key until the dead message is replayed or discarded.
	OnDead string
	// OnConfigError is what a configuration failure of the target (access
	// denied, the target missing) does to a message (on_config_error):
	// OnConfigErrorHold retries it without end, with a capped backoff;
	// OnConfigErrorDead dead-letters it.
	OnConfigError string

	schema *jsonschema.Schema
}

// HasSchema reports whether the route validates payloads against a schema.
func (r *Route) HasSchema() bool { return r.schema != nil }

// Target is where a route delivers. Only the fields of its Type are set.
type Target struct {
	// Type is "sns", "eventbridge", "http" or "lambda".
	Type string
	// Timeout and MaxPayloadBytes repeat the route's, so that a publisher
	// built from a Target alone has them; they are part of Key.
	Timeout         time.Duration
	MaxPayloadBytes int
	// Concurrency is the calls to the target in flight at once within a
	// batch (target.concurrency). For per-message targets (http, lambda)
	// it is what bounds throughput: concurrency / call latency.
	Concurrency int

	// TopicARN is the SNS topic (sns).
	TopicARN string
	// MessageGroupID is the MessageGroupId of messages without an ordering
	// key (sns, FIFO topics only).
	MessageGroupID string

	// EventBus is the EventBridge bus name or ARN (eventbridge).
	EventBus string
	// Source and DetailType are the events' templates (eventbridge); they
	// may contain {namespace} and {topic}. See ExpandTemplate.
	Source     string
	DetailType string

	// URL is the webhook endpoint (http).
	URL string
	// SigningSecretEnv names the environment variable holding the Standard
	// Webhooks signing secret (http); exclusive with SigningSecretARN.
	SigningSecretEnv string
	// SigningSecretARN is the Secrets Manager ARN of the signing secret
	// (http); exclusive with SigningSecretEnv.
	SigningSecretARN string
	// Headers are static extra headers (http).
	Headers map[string]string
	// AllowInsecureHTTP permits an http:// URL to a host other than
	// localhost, 127.0.0.1 or ::1 (http).
	AllowInsecureHTTP bool

	// Function is the Lambda function name, partial or full ARN, with an
	// optional :qualifier (lambda).
	Function string

	key string
}

// Key is the target's stable identity: two routes whose targets have equal
// keys share one publisher. It covers every field, so targets that differ
// in anything (a header, a secret, the timeout) get separate publishers.
// Parse computes it once; Key on a Target built by hand computes it on
// each call.
func (t Target) Key() string {
	if t.key != "" {
		return t.key
	}
	return t.computeKey()
}

func (t Target) computeKey() string {
	// JSON with a fixed field order (map keys sorted by encoding/json) is
	// unambiguous whatever the values contain, and readable in logs.
	b, err := json.Marshal(struct {
		Type              string            `json:"type"`
		TopicARN          string            `json:"topic_arn,omitempty"`
		MessageGroupID    string            `json:"message_group_id,omitempty"`
		EventBus          string            `json:"event_bus,omitempty"`
		Source            string            `json:"source,omitempty"`
		DetailType        string            `json:"detail_type,omitempty"`
		URL               string            `json:"url,omitempty"`
		SigningSecretEnv  string            `json:"signing_secret_env,omitempty"`
		SigningSecretARN  string            `json:"signing_secret_arn,omitempty"`
		Headers           map[string]string `json:"headers,omitempty"`
		AllowInsecureHTTP bool              `json:"allow_insecure_http,omitempty"`
		Function          string            `json:"function,omitempty"`
		Timeout           string            `json:"timeout,omitempty"`
		MaxPayloadBytes   int               `json:"max_payload_bytes,omitempty"`
		Concurrency       int               `json:"concurrency,omitempty"`
	}{
		t.Type, t.TopicARN, t.MessageGroupID, t.EventBus, t.Source, t.DetailType,
		t.URL, t.SigningSecretEnv, t.SigningSecretARN, t.Headers, t.AllowInsecureHTTP,
		t.Function, durationString(t.Timeout), t.MaxPayloadBytes, t.Concurrency,
	})
	if err != nil {
		// Strings, a string map, a bool and an int always marshal.
		panic("route: marshalling a target key: " + err.Error())
	}
	return string(b)
}

func durationString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// IsFIFO reports whether the target is an SNS FIFO topic (its name ends in
// ".fifo"): messages need a MessageGroupId and a MessageDeduplicationId.
func (t Target) IsFIFO() bool {
	return t.Type == TypeSNS && strings.HasSuffix(t.TopicARN, ".fifo")
}

// The placeholders of EventBridge source and detail-type templates.
const (
	PlaceholderNamespace = "{namespace}"
	PlaceholderTopic     = "{topic}"
)

// ExpandTemplate replaces {namespace} and {topic} in an EventBridge source
// or detail-type template. Parse has checked that a route's templates hold
// no other placeholder.
func ExpandTemplate(template, namespace, topic string) string {
	return strings.NewReplacer(PlaceholderNamespace, namespace, PlaceholderTopic, topic).Replace(template)
}
