// Package route maps a message's (namespace, topic) to one target (an SNS
// topic, an EventBridge bus, a signed HTTP webhook or a Lambda function)
// and its delivery policy: retries, timeout, payload size cap and payload
// schema.
//
// The configuration is read once per cold start (the config package reads
// OUTBOX_ROUTES, OUTBOX_ROUTES_FILE or OUTBOX_ROUTES_SSM_PARAMETER), checked
// as a whole, and indexed so that Table.Match is O(1) and allocation-free.
// Text that starts with { or [ is JSON; anything else is YAML 1.2, one
// document (quote "*", which is an alias, and a value that starts with {,
// which is a mapping). An explicit null, "" or false is an absent field (but
// in a payload schema or a header value). A message goes to the most
// specific route that matches it: exact namespace and exact topic, then
// exact namespace and "*", then "*" and exact topic, then "*" and "*".
//
// routes.schema.json (JSON Schema draft 2020-12) is the reference: every
// field with its description, type, default and the rules on its value.
// Parse validates against it (docs/CONFIGURATION.md's routes table is generated
// from it, and editors can use it) and adds only what a schema cannot say:
// two routes with the same patterns or name, retry.max_attempts above the
// attempt ceiling (Options), max_delay below base_delay, a timeout of 0 or
// above 5m, EventBridge templates that expand too long or into "aws." for
// the route's names, a webhook URL's scheme, host, credentials and query,
// reserved, secret-looking or case-duplicated headers, and a payload schema
// that does not compile. A *ConfigError lists every problem at its field
// path, suggesting the name meant for an unknown field.
//
// Secrets are referenced (signing_secret_env, signing_secret_arn), never
// inline: a field, header or query parameter named like a secret is an
// error, and a value that may hold one (a URL, a header) is never quoted.
// Routes whose targets are equal in every field share one publisher
// (Target.Key).
package route
