package route

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/outboxkit/dispatcher/shared/retry"
)

// FieldDoc documents one configuration field. Fields is checked against the
// decoding structs by a test, so that a field cannot be added, renamed or
// removed without its documentation.
type FieldDoc struct {
	// Path is the field's path: "routes[].target.topic_arn".
	Path string
	// Type is the JSON type: string, integer, boolean, object, list,
	// duration (a Go duration string such as "1m30s"), "map of string"
	// (an object of string values) or "JSON Schema".
	Type string
	// Target is the target type the field belongs to; empty for a field of
	// every route or target.
	Target string
	// Required says whether the field must be set.
	Required bool
	// Default is the value when the field is absent; empty when there is
	// none.
	Default string
	// Rule says what values are valid.
	Rule string
	// Doc says what the field does.
	Doc string
}

func bytesDoc(n int) string {
	switch {
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d (%d MiB)", n, n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d (%d KiB)", n, n>>10)
	}
	return strconv.Itoa(n)
}

func payloadDefaultsDoc() string {
	var parts []string
	for _, typ := range TargetTypes {
		parts = append(parts, typ+" "+bytesDoc(PayloadLimits[typ].Default))
	}
	return strings.Join(parts, "; ")
}

func payloadMaximaDoc() string {
	var parts []string
	for _, typ := range TargetTypes {
		parts = append(parts, typ+" "+bytesDoc(PayloadLimits[typ].Max))
	}
	return "1 to the target type's maximum: " + strings.Join(parts, "; ")
}

const nameRule = `1-128 characters of letters, digits and . _ : / -, starting with a letter or digit`

// Fields documents every configuration field, in the order of the
// reference in the package documentation.
var Fields = []FieldDoc{
	{Path: "routes", Type: "list", Required: true,
		Rule: "at least one route",
		Doc:  "The routes. A message goes to the most specific route that matches it; a message no route matches is dead-lettered as NO_ROUTE."},
	{Path: "routes[].name", Type: "string", Default: "routes[<index>]",
		Rule: nameRule + "; unique",
		Doc:  "Names the route in logs, metrics and dead-letter reasons."},
	{Path: "routes[].match", Type: "object", Required: true,
		Rule: "no two routes with the same namespace and topic",
		Doc:  "The messages the route takes."},
	{Path: "routes[].match.namespace", Type: "string", Required: true,
		Rule: `"*" or an exact namespace: ` + nameRule,
		Doc:  "The message namespace to match; \"*\" matches any."},
	{Path: "routes[].match.topic", Type: "string", Required: true,
		Rule: `"*" or an exact topic: ` + nameRule,
		Doc:  "The message topic to match; \"*\" matches any."},
	{Path: "routes[].target", Type: "object", Required: true,
		Rule: "only the fields of its type",
		Doc:  "Where the messages go."},
	{Path: "routes[].target.type", Type: "string", Required: true,
		Rule: strings.Join(TargetTypes, ", "),
		Doc:  "The kind of target."},
	{Path: "routes[].target.timeout", Type: "duration", Default: formatDuration(DefaultTimeout),
		Rule: "more than 0, at most " + formatDuration(MaxTimeout),
		Doc:  "Bounds each call to the target; a call that takes longer is retried as TIMEOUT."},
	{Path: "routes[].target.concurrency", Type: "integer", Default: strconv.Itoa(DefaultConcurrency),
		Rule: "1-" + strconv.Itoa(MaxConcurrency),
		Doc:  "Calls to the target in flight at once within a batch (SNS and EventBridge calls carry 10 messages each; webhooks and Lambda one). Throughput to a target is at most concurrency × messages per call / call latency."},
	{Path: "routes[].target.topic_arn", Type: "string", Target: TypeSNS, Required: true,
		Rule: "arn:<partition>:sns:<region>:<12-digit account>:<topic name>; partition aws, aws-cn or aws-us-gov; a name ending in .fifo is a FIFO topic",
		Doc:  "The SNS topic to publish to."},
	{Path: "routes[].target.message_group_id", Type: "string", Target: TypeSNS,
		Rule: "FIFO topics only; 1-" + strconv.Itoa(maxMessageGroupIDLen) + " printable ASCII characters without spaces",
		Doc:  "The MessageGroupId of messages that have no ordering key (a message's ordering key is its group otherwise)."},
	{Path: "routes[].target.event_bus", Type: "string", Target: TypeEventBridge, Required: true,
		Rule: "a bus name of 1-256 characters of letters, digits and / . - _, or arn:<partition>:events:<region>:<12-digit account>:event-bus/<name>",
		Doc:  "The EventBridge event bus to put events on."},
	{Path: "routes[].target.source", Type: "string", Target: TypeEventBridge, Default: DefaultSource,
		Rule: "text with the placeholders {namespace} and {topic} only; must not start with \"aws.\"; at most " + strconv.Itoa(maxSourceLen) + " characters once expanded",
		Doc:  "The template of each event's Source."},
	{Path: "routes[].target.detail_type", Type: "string", Target: TypeEventBridge, Default: DefaultDetailType,
		Rule: "text with the placeholders {namespace} and {topic} only; at most " + strconv.Itoa(maxDetailTypeLen) + " characters once expanded",
		Doc:  "The template of each event's DetailType."},
	{Path: "routes[].target.url", Type: "string", Target: TypeHTTP, Required: true,
		Rule: "an absolute https:// URL (http:// to localhost, 127.0.0.0/8 or ::1, or with allow_insecure_http); no user:password, no #fragment, no secret-looking query parameter",
		Doc:  "The webhook endpoint; messages are POSTed to it as JSON, signed per Standard Webhooks."},
	{Path: "routes[].target.signing_secret_env", Type: "string", Target: TypeHTTP,
		Rule: "an environment variable name ([A-Za-z_][A-Za-z0-9_]*); exactly one of signing_secret_env and signing_secret_arn",
		Doc:  "The environment variable that holds the Standard Webhooks signing secret."},
	{Path: "routes[].target.signing_secret_arn", Type: "string", Target: TypeHTTP,
		Rule: "arn:<partition>:secretsmanager:<region>:<12-digit account>:secret:<name>; exactly one of signing_secret_env and signing_secret_arn",
		Doc:  "The Secrets Manager secret that holds the Standard Webhooks signing secret."},
	{Path: "routes[].target.headers", Type: "map of string", Target: TypeHTTP,
		Rule: "valid HTTP header names and values; not a reserved header (Content-Type, Content-Length, Host, Idempotency-Key, User-Agent, Connection, Transfer-Encoding, TE, Trailer, Upgrade, Keep-Alive, Proxy-Connection, Expect, webhook-*, X-Amz*, Outbox*, aws.*, amazon.*); not a credential (Authorization, Cookie, *token*, *secret*, *api-key*, ...)",
		Doc:  "Static headers added to every request."},
	{Path: "routes[].target.allow_insecure_http", Type: "boolean", Target: TypeHTTP, Default: "false",
		Doc: "Permits an http:// URL to a host other than localhost, 127.0.0.0/8 or ::1."},
	{Path: "routes[].target.function", Type: "string", Target: TypeLambda, Required: true,
		Rule: "a function name (1-64 letters, digits, - and _), <account>:function:<name> or arn:<partition>:lambda:<region>:<account>:function:<name>, each with an optional :<version or alias>",
		Doc:  "The Lambda function to invoke (RequestResponse) with each message's envelope."},
	{Path: "routes[].retry", Type: "object",
		Doc: "The retry policy: exponential backoff with full jitter. Each absent field takes its default."},
	{Path: "routes[].retry.max_attempts", Type: "integer", Default: strconv.Itoa(retry.Default.MaxAttempts),
		Rule: "1 to " + strconv.Itoa(MaxAttemptsCeiling) + " (the database's attempt ceiling)",
		Doc:  "Attempts in all, the first included; a message whose last attempt fails retryably is dead-lettered."},
	{Path: "routes[].retry.base_delay", Type: "duration", Default: formatDuration(retry.Default.BaseDelay),
		Rule: "0 or more",
		Doc:  "The cap of the first retry's delay; each retry doubles the cap up to max_delay."},
	{Path: "routes[].retry.max_delay", Type: "duration", Default: formatDuration(retry.Default.MaxDelay),
		Rule: "at least base_delay",
		Doc:  "The largest delay between attempts (a target's Retry-After may ask for more, up to " + formatDuration(retry.MaxRetryAfter) + ")."},
	{Path: "routes[].max_payload_bytes", Type: "integer", Default: payloadDefaultsDoc(),
		Rule: payloadMaximaDoc(),
		Doc:  "The largest payload the route sends, in bytes of its JSON; a larger one is dead-lettered as PAYLOAD_TOO_LARGE without a call."},
	{Path: "routes[].on_dead", Type: "string", Default: OnDeadSkip,
		Rule: OnDeadSkip + " or " + OnDeadPark,
		Doc:  "What an ordered message's death does to its ordering key: skip lets the key's next message go; park holds the key until the dead message is replayed (it goes first) or discarded by an operator."},
	{Path: "routes[].on_config_error", Type: "string", Default: OnConfigErrorHold,
		Rule: OnConfigErrorHold + " or " + OnConfigErrorDead,
		Doc:  "What a configuration failure of the target (ACCESS_DENIED: IAM, KMS, a resource policy or credentials; TARGET_NOT_FOUND) does to a message: hold retries it without end, the backoff capped at 5m, and alarms; dead dead-letters it."},
	{Path: "routes[].schema", Type: "JSON Schema",
		Rule: "an object or a boolean that compiles (draft 2020-12 unless $schema says otherwise); no reference outside itself",
		Doc:  "Validates each payload before delivery; a payload that fails is dead-lettered as INVALID_PAYLOAD without a call."},
}

// MarkdownReference renders Fields as the Markdown table the README
// carries; a test keeps the two equal.
func MarkdownReference() string {
	var b strings.Builder
	b.WriteString("| field | type | required / default | target | valid values | meaning |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, f := range Fields {
		need := ""
		switch {
		case f.Required:
			need = "required"
		case f.Default != "":
			need = "default " + f.Default
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", f.Path, f.Type, cell(need), cell(f.Target), cell(f.Rule), cell(f.Doc))
	}
	return b.String()
}

// cell escapes text for a Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ", "<", "&lt;", ">", "&gt;").Replace(s)
}
