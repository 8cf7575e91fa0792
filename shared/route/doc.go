// Package route maps a message's (namespace, topic) to one target (an SNS
// topic, an EventBridge bus, a signed HTTP webhook or a Lambda function)
// and the delivery policy that goes with it: retries, timeout, payload size
// cap and payload schema.
//
// The configuration is read once per cold start, validated as a whole, and
// indexed so that Table.Match is O(1) and allocation-free on the hot path:
//
//	routes, err := route.Parse(data, route.Options{AttemptCeiling: ceiling})
//	if err != nil {
//		return err // a *ConfigError lists every problem, one per line
//	}
//	r := routes.Match(msg.Namespace, msg.Topic) // nil: NO_ROUTE
//
// # Where the configuration comes from
//
// The config package reads it from OUTBOX_ROUTES (the configuration itself),
// OUTBOX_ROUTES_FILE (the path of a file holding it) or
// OUTBOX_ROUTES_SSM_PARAMETER (an SSM parameter holding it), hands Parse the
// bytes, and names the variable (and the file or parameter) in the error's
// Source.
// Text whose first
// character (after white space) is { or [ is read as JSON; anything else as
// YAML 1.2 (as editors' YAML language server reads it), which is converted
// to JSON and then decoded by the same strict JSON decoder. A configuration
// is at most 4 MiB (MaxConfigBytes), nested at most 100 levels deep, and a
// YAML file holds one document.
//
// In YAML, quote "*": a bare * starts an alias. Quote names that YAML would
// read as something else: true, false, null and numbers ("2024"). An explicit null, an empty string or false is the same as an
// absent field (but in a payload schema or a header value).
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
// are an error. A message that no route matches fails with NO_ROUTE, a
// configuration failure: it is held and retried with a capped backoff, not
// dead-lettered, until a route covers it. Add a "*"/"*" route to catch
// everything; outboxctl routes check lists what a file routes where, and
// outboxctl invoke dispatch warns of pending topics no route matches.
//
// # Reference
//
// routes.schema.json, a JSON Schema (draft 2020-12), is the configuration's
// reference: every field with its description, type, default and the rules
// on its value; Parse validates against it, and the README's routes
// reference is generated from it. A YAML or JSON language server validates
// and completes a routes file with it (see the README). Parse adds what a
// schema cannot say: two routes with the same patterns or the same name,
// retry.max_attempts above the attempt ceiling (Options.AttemptCeiling),
// max_delay below base_delay, a timeout of 0 or above 5m, EventBridge
// templates that expand too long or into "aws." for the route's names, a
// webhook URL's scheme, host and credentials, reserved or secret-looking
// headers, and a payload schema that does not compile.
//
// Every field, its JSON type, and whether it is required or its default:
//
//	routes                               list          required
//	routes[].name                        string
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
//	routes[].schema                      JSON Schema
//	routes[].on_dead                     string        default skip
//	routes[].on_config_error             string        default hold
//
// A duration is a Go duration string: "500ms", "30s", "15m", "1h30m".
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
// lists one problem per line, sorted by route and field, each naming the
// route index and the field:
//
//	route: invalid configuration in OUTBOX_ROUTES_FILE "/var/task/routes.yaml" (2 problems):
//	routes[1].target.topic_arn: must have a 12-digit account id; got "arn:aws:sns:eu-west-1:1234:payments"
//	routes[3].target.signing_secret: secrets are referenced with signing_secret_env or signing_secret_arn, never inline
//
// A value that may hold a credential (a URL, a header's value, a field
// named like a secret) is never quoted.
//
// # Targets and publishers
//
// Target.Key is a target's identity: routes whose targets are equal in
// every field (timeout and max_payload_bytes included) share one
// publisher; Table.Targets lists the distinct ones. Route.CheckPayload
// validates a payload against the route's schema.
package route
