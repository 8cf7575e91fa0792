// Package route maps a message's (namespace, topic) to one target (an SNS
// topic, an EventBridge bus, a signed HTTP webhook or a Lambda function)
// and the delivery policy that goes with it: retries, timeout, payload size
// cap and payload schema.
//
// The configuration is read once per cold start, validated as a whole, and
// indexed so that Table.Match is O(1) and allocation-free on the hot path:
//
//	routes, err := route.FromEnv(os.Getenv, os.ReadFile)
//	if err != nil {
//		return err // a *ConfigError lists every problem, one per line
//	}
//	r := routes.Match(msg.Namespace, msg.Topic) // nil: NO_ROUTE
//
// # Where the configuration comes from
//
// FromEnv reads exactly one of two environment variables:
//
//	OUTBOX_ROUTES       the configuration itself, as JSON (YAML is accepted too)
//	OUTBOX_ROUTES_FILE  the path of a file holding it, JSON or YAML
//
// Setting both, or neither, is an error naming both; a file that cannot be
// read is an error naming the variable and the path. Text whose first
// character (after white space) is { or [ is read as JSON; anything else as
// YAML, which is converted to JSON (sigs.k8s.io/yaml) and then decoded by
// the same strict JSON decoder. A configuration is at most 4 MiB
// (MaxConfigBytes), nested at most 100 levels deep, and a YAML file holds
// one document.
//
// In YAML, quote "*": a bare * starts an alias. Quote names that YAML would
// read as something else: yes, no, on, off, true, false, null and numbers
// ("2024"). An explicit null is the same as an absent field.
//
// # Matching
//
// Each route matches an exact namespace or "*", and an exact topic or "*".
// A message goes to the most specific route that matches it:
//
//  1. exact namespace and exact topic
//  2. exact namespace and "*"
//  3. "*" and exact topic
//  4. "*" and "*"
//
// An exact namespace outranks an exact topic, so {"namespace": "payments",
// "topic": "*"} wins over {"namespace": "*", "topic": "refund"} for the
// message (payments, refund). The order of the routes in the configuration
// does not matter; two routes with the same namespace and topic patterns
// are an error. A message that no route matches is dead-lettered with the
// terminal code NO_ROUTE: add a "*"/"*" route to catch everything.
//
// # Reference
//
// Every field, its JSON type, and whether it is required or its default
// (Fields holds the same table, with the rules, for tools):
//
//	routes                               list          required
//	routes[].name                        string        default routes[<index>]
//	routes[].match                       object        required
//	routes[].match.namespace             string        required
//	routes[].match.topic                 string        required
//	routes[].target                      object        required
//	routes[].target.type                 string        required
//	routes[].target.timeout              duration      default 10s
//	routes[].target.concurrency          integer       default 8
//	routes[].target.topic_arn            string        required (sns)
//	routes[].target.message_group_id     string        (sns)
//	routes[].target.event_bus            string        required (eventbridge)
//	routes[].target.source               string        default outbox.{namespace} (eventbridge)
//	routes[].target.detail_type          string        default {topic} (eventbridge)
//	routes[].target.url                  string        required (http)
//	routes[].target.signing_secret_env   string        (http)
//	routes[].target.signing_secret_arn   string        (http)
//	routes[].target.headers              map of string (http)
//	routes[].target.allow_insecure_http  boolean       default false (http)
//	routes[].target.function             string        required (lambda)
//	routes[].retry                       object
//	routes[].retry.max_attempts          integer       default 12
//	routes[].retry.base_delay            duration      default 1s
//	routes[].retry.max_delay             duration      default 15m
//	routes[].max_payload_bytes           integer       default sns 262144 (256 KiB); eventbridge 262144 (256 KiB); http 1048576 (1 MiB); lambda 1048576 (1 MiB)
//	routes[].on_dead                     string        default skip
//	routes[].on_config_error             string        default hold
//	routes[].schema                      JSON Schema
//
// A duration is a Go duration string: "500ms", "30s", "15m", "1h30m".
//
// A route:
//
//   - name: names the route in logs, metrics and dead-letter reasons; 1-128
//     characters of letters, digits and . _ : / -, starting with a letter or
//     digit; unique. Without it the route is called routes[<index>].
//   - match.namespace, match.topic: "*" or an exact name (1-128 characters
//     of letters, digits and . _ : / -, starting with a letter or digit, as
//     for messages). Partial wildcards ("pay*") are not supported.
//   - retry: exponential backoff with full jitter. max_attempts counts every
//     attempt, the first included, from 1 to 100 (the database's own attempt
//     ceiling); a message whose last attempt fails retryably is
//     dead-lettered. base_delay (0 or more) caps the first retry's delay,
//     and each retry doubles the cap up to max_delay (at least base_delay).
//     A target's Retry-After is honoured as a floor, up to 24h. Each absent
//     field takes its default.
//   - max_payload_bytes: the largest payload the route sends, in bytes of
//     the payload's JSON; a larger payload is dead-lettered as
//     PAYLOAD_TOO_LARGE without a call. From 1 to the target type's maximum:
//     sns 1048576 (1 MiB), eventbridge 1048576 (1 MiB), http 10485760
//     (10 MiB), lambda 6291456 (6 MiB, Lambda's synchronous invocation
//     limit). SNS and EventBridge accept 256 KiB unless the topic or
//     account is configured for more.
//   - on_dead: what the death of an ordered message (one with an ordering
//     key) does to its key. "skip" (the default) lets the key's next message
//     go: the dead one is skipped, and if it is replayed later it is
//     delivered as the key's next message, out of its original sequence
//     (its REPLAYED attempt says so). "park" holds the key: its later
//     messages wait, in order, until the dead message is replayed (it goes
//     first) or discarded by an operator with a reason. Payment and billing
//     streams, where a later message must never overtake an earlier one,
//     want "park".
//   - on_config_error: what a configuration failure of the target does to
//     a message: ACCESS_DENIED (IAM, a KMS key policy, a topic, bus or
//     function policy, missing or expired credentials) and TARGET_NOT_FOUND
//     (the topic, bus or function does not exist). Such a failure is not
//     the message's: "hold" (the default) retries it without end, the
//     backoff capped at 5m, each attempt recorded, and the dispatch
//     function's Held metric alarms; an ordered key's later messages keep
//     waiting. "dead" dead-letters it, as every other terminal failure.
//     A message no route matches (NO_ROUTE) is always held.
//   - schema: a JSON Schema (an object, or true/false) that each payload
//     must satisfy; a payload that fails is dead-lettered as INVALID_PAYLOAD
//     without a call, with the broken rules and their locations as the
//     reason. Draft 2020-12 unless the schema's $schema names another
//     draft (4, 6, 7, 2019-09). The schema is compiled once, at load, and
//     must be self-contained: a $ref outside it (a URL or a file) is an
//     error; put shared definitions under $defs. "format" is an annotation,
//     as the draft says, not an assertion. Patterns use Go's RE2 syntax.
//   - target: exactly one target; a field of another target type (topic_arn
//     on an http target) is an error. target.timeout, common to all types,
//     bounds each call to the target: more than 0, at most 5m.
//     target.concurrency, also common, is the calls to the target in flight
//     at once within a batch (1-256, default 8): with SNS and EventBridge
//     each call carries up to 10 messages, with webhooks and Lambda one, so
//     a target's throughput is at most concurrency × messages per call /
//     call latency.
//
// An sns target publishes with SNS PublishBatch:
//
//   - topic_arn (required): arn:<partition>:sns:<region>:<12-digit
//     account>:<topic name>, the partition aws, aws-cn or aws-us-gov and the
//     region one of the partition's. A name ending in .fifo is a FIFO topic:
//     each message gets a MessageGroupId (its ordering key) and a
//     MessageDeduplicationId (namespace|topic|dedupe key, since a dedupe
//     key is unique only within its namespace and topic; else its id).
//   - message_group_id: FIFO topics only; the MessageGroupId of messages
//     without an ordering key; at most 128 printable ASCII characters
//     without spaces.
//
// An eventbridge target puts events with EventBridge PutEvents:
//
//   - event_bus (required): a bus name (1-256 characters of letters, digits
//     and / . - _, such as "default") or an event bus ARN,
//     arn:<partition>:events:<region>:<12-digit account>:event-bus/<name>.
//   - source, detail_type: templates of each event's Source and DetailType,
//     default "outbox.{namespace}" and "{topic}". The only placeholders are
//     {namespace} and {topic}; any other text in braces is an error. A
//     source must not start with "aws." (AWS reserves it); at most 256
//     (source) and 128 (detail_type) characters once expanded. These are
//     checked with the route's exact names where it has them; a source
//     beginning with {namespace} on a "*" route is refused by EventBridge
//     at delivery for a namespace beginning with "aws.".
//
// An http target POSTs each message's envelope as JSON, signed per the
// Standard Webhooks scheme (webhook-id, webhook-timestamp,
// webhook-signature):
//
//   - url (required): an absolute https:// URL. http:// is allowed only to
//     localhost, 127.0.0.0/8 or ::1, or with allow_insecure_http: true. No
//     user:password@, no #fragment, no query parameter that looks like a
//     credential.
//   - signing_secret_env or signing_secret_arn (exactly one): the name of
//     the environment variable holding the signing secret
//     ([A-Za-z_][A-Za-z0-9_]*), or the ARN of the Secrets Manager secret
//     holding it, arn:<partition>:secretsmanager:<region>:<12-digit
//     account>:secret:<name>. Webhooks are always signed.
//   - headers: static headers added to every request: valid HTTP names and
//     values, none reserved (Content-Type, Content-Length, Host,
//     Idempotency-Key, User-Agent, Connection, Transfer-Encoding, TE,
//     Trailer, Upgrade, Keep-Alive, Proxy-Connection, Expect, webhook-*,
//     X-Amz*, Outbox*, aws.*, amazon.*), none that would carry a credential
//     (Authorization, Cookie, or a name with token, secret, password,
//     api-key, credential and the like), no two differing only in case.
//   - allow_insecure_http (default false): permits http:// to any host.
//
// A lambda target invokes a function (RequestResponse) with each message's
// envelope:
//
//   - function (required): a function name (1-64 letters, digits, - and
//     _), a partial ARN <12-digit account>:function:<name>, or a full ARN
//     arn:<partition>:lambda:<region>:<12-digit account>:function:<name>,
//     each with an optional :<qualifier> ($LATEST, a version or an alias).
//
// Secrets are referenced, never inline: a field that looks like a secret
// (signing_secret, secret, password, token, api_key, ...) anywhere in the
// configuration is an error that says so, as is a credential in a URL or a
// header.
//
// # Example
//
// The example in JSON:
//
//	{"routes": [
//	  {"name": "billing-usage",
//	   "match": {"namespace": "mini-chat", "topic": "usage_snapshot"},
//	   "target": {"type": "http", "url": "https://billing.internal/usage",
//	              "signing_secret_env": "BILLING_WEBHOOK_SECRET", "timeout": "5s"},
//	   "retry": {"max_attempts": 12, "base_delay": "1s", "max_delay": "15m"},
//	   "max_payload_bytes": 65536,
//	   "schema": {"type": "object", "required": ["tenant_id"]}},
//	  {"match": {"namespace": "payments", "topic": "*"},
//	   "target": {"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:payments.fifo",
//	              "message_group_id": "payments"}},
//	  {"match": {"namespace": "*", "topic": "*"},
//	   "target": {"type": "eventbridge", "event_bus": "default",
//	              "source": "outbox.{namespace}", "detail_type": "{topic}"}},
//	  {"match": {"namespace": "audit", "topic": "*"},
//	   "target": {"type": "lambda", "function": "arn:aws:lambda:eu-west-1:123456789012:function:audit-sink"}}
//	]}
//
// The same in YAML:
//
//	routes:
//	  - name: billing-usage
//	    match: {namespace: mini-chat, topic: usage_snapshot}
//	    target:
//	      type: http
//	      url: https://billing.internal/usage
//	      signing_secret_env: BILLING_WEBHOOK_SECRET
//	      timeout: 5s
//	    retry: {max_attempts: 12, base_delay: 1s, max_delay: 15m}
//	    max_payload_bytes: 65536
//	    schema:
//	      type: object
//	      required: [tenant_id]
//	  - match: {namespace: payments, topic: "*"}
//	    target:
//	      type: sns
//	      topic_arn: arn:aws:sns:eu-west-1:123456789012:payments.fifo
//	      message_group_id: payments
//	  - match: {namespace: "*", topic: "*"}
//	    target:
//	      type: eventbridge
//	      event_bus: default
//	      source: outbox.{namespace}
//	      detail_type: "{topic}"
//	  - match: {namespace: audit, topic: "*"}
//	    target:
//	      type: lambda
//	      function: arn:aws:lambda:eu-west-1:123456789012:function:audit-sink
//
// (In YAML, a value that starts with { is a flow mapping: quote "{topic}".)
//
// # Errors
//
// Validation happens once, at load, over the whole configuration, and
// reports every problem rather than the first: a *ConfigError whose Error
// lists one problem per line, each naming the route index and the field:
//
//	route: invalid configuration in OUTBOX_ROUTES_FILE "/var/task/routes.yaml" (2 problems):
//	routes[1].target.topic_arn: "arn:aws:sns:eu-west-1:1234:payments" has account "1234"; an account id is 12 digits
//	routes[3].target.signing_secret: secrets are referenced with signing_secret_env or signing_secret_arn, never inline
//
// # Targets and publishers
//
// Target.Key is a target's identity: routes whose targets are equal in
// every field (timeout and max_payload_bytes included) share one
// publisher; Table.Targets lists the distinct ones. Route.CheckPayload
// validates a payload against the route's schema.
package route
