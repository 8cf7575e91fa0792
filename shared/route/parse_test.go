package route

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/backoff"
)

// config wraps routes (JSON objects) in a configuration.
func config(routes ...string) string {
	return `{"routes": [` + strings.Join(routes, ",\n") + `]}`
}

// routeTo is a route of the pattern ns/tp to a target, with extra route
// fields (JSON members, comma-prefixed by the caller's choice of none).
func routeTo(target string, extra ...string) string {
	fields := []string{`"match": {"namespace": "ns", "topic": "tp"}`, `"target": ` + target}
	return "{" + strings.Join(append(fields, extra...), ", ") + "}"
}

const (
	snsTarget    = `{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:orders"}`
	fifoTarget   = `{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:payments.fifo", "message_group_id": "payments"}`
	ebTarget     = `{"type": "eventbridge", "event_bus": "default"}`
	httpTarget   = `{"type": "http", "url": "https://billing.internal/usage", "signing_secret_env": "BILLING_SECRET"}`
	lambdaTarget = `{"type": "lambda", "function": "audit-sink"}`
)

// want is one expected problem: its field path and a phrase of its message.
type want struct{ field, msg string }

func routeIndexOf(t *testing.T, field string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(field, "routes[%d]", &i); err != nil {
		return -1
	}
	return i
}

// checkProblems asserts that Parse rejects data with exactly the wanted
// problems, in order.
func checkProblems(t *testing.T, data string, wants ...want) {
	t.Helper()
	table, err := Parse([]byte(data), Options{})
	if err == nil {
		t.Fatalf("Parse accepted the configuration (%d routes); want %d problems", len(table.Routes), len(wants))
	}
	ce, ok := errors.AsType[*ConfigError](err)
	if !ok {
		t.Fatalf("error is %T (%v), want *ConfigError", err, err)
	}
	if len(ce.Problems) != len(wants) {
		t.Fatalf("got %d problems, want %d:\n%v", len(ce.Problems), len(wants), err)
	}
	for i, w := range wants {
		p := ce.Problems[i]
		if p.Field != w.field || !strings.Contains(p.Message, w.msg) {
			t.Errorf("problem %d = %q\nwant field %q with a message containing %q", i, p.String(), w.field, w.msg)
		}
		if wantRoute := routeIndexOf(t, w.field); p.Route != wantRoute {
			t.Errorf("problem %d: Route = %d, want %d", i, p.Route, wantRoute)
		}
		if line := p.String(); !strings.Contains(err.Error(), "\n"+line) {
			t.Errorf("Error() does not list %q on a line of its own:\n%s", line, err)
		}
	}
}

func TestParseRejectsBadDocuments(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, data string
		want       want
	}{
		{"truncated JSON", `{"routes": [`, want{"", "not valid JSON: unexpected end of JSON input"}},
		{"JSON syntax error with position", "{\"routes\": [\n  {\"match\": }\n]}", want{"", "(line 2, column 13)"}},
		{"trailing JSON", `{"routes": []} {}`, want{"", "not valid JSON"}},
		{"not YAML", "routes: [\n  - a\n", want{"", "not valid YAML"}},
		{"unquoted asterisk in YAML", "routes:\n  - match:\n      namespace: *\n", want{"", `line 3 has an unquoted *, which YAML reads as an alias: write "*"`}},
		{"duplicate YAML key", "routes: []\nroutes: []\n", want{"", `not valid YAML`}},
		{"several YAML documents", "routes: []\n---\nroutes: []\n", want{"", "the YAML holds 2 documents"}},
		{"empty", "", want{"", "the configuration is empty"}},
		{"only a YAML comment", "  \n# nothing here\n", want{"", "the configuration is empty"}},
		{"top level list", `[]`, want{"", `the configuration must be an object, not a list`}},
		{"top level string in YAML", `just text`, want{"", `not the string "just text"`}},
		{"too large", `{"routes": [` + strings.Repeat(" ", MaxConfigBytes) + `]}`, want{"", "over the limit of 4194304"}},
		{"too deep", config(routeTo(snsTarget, `"schema": `+strings.Repeat(`{"not": `, 200)+`{}`+strings.Repeat(`}`, 200))), want{"", "nested more than 100 levels deep"}},
		{"missing routes", `{}`, want{"routes", "is required"}},
		{"null routes", `{"routes": null}`, want{"routes", "is required"}},
		{"empty routes", `{"routes": []}`, want{"routes", "is empty: list at least one route"}},
		{"routes not a list", `{"routes": {"match": {}}}`, want{"routes", "must be a list, not an object"}},
		{"unknown top-level field", `{"routes": [` + routeTo(snsTarget) + `], "defaults": {}}`, want{"defaults", `unknown field "defaults"; the fields of the configuration are routes`}},
		{"duplicate JSON key", `{"routes": [` + routeTo(snsTarget) + `], "routes": []}`, want{"routes", "appears twice; a second value would silently replace the first"}},
		{"route not an object", `{"routes": ["sns"]}`, want{"routes[0]", `must be an object, not the string "sns"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkProblems(t, tc.data, tc.want)
		})
	}
}

func TestParseRejectsBadRoutes(t *testing.T) {
	t.Parallel()
	longName := strings.Repeat("n", 129)
	for _, tc := range []struct {
		name, route string
		want        []want
	}{
		// Unknown fields and inline secrets, at every level.
		{"unknown route field", routeTo(snsTarget, `"priority": 1`), []want{{"routes[0].priority", `unknown field "priority"; the fields of a route are name, match, target, retry, circuit_breaker, rate_limit, max_payload_bytes, schema`}}},
		{"unknown match field", `{"match": {"namespace": "ns", "topic": "tp", "tenant": "t"}, "target": ` + snsTarget + `}`, []want{{"routes[0].match.tenant", `unknown field "tenant"; the fields of a match are namespace, topic`}}},
		{"unknown retry field", routeTo(snsTarget, `"retry": {"attempts": 3}`), []want{{"routes[0].retry.attempts", `unknown field "attempts"; the fields of a retry policy are max_attempts, base_delay, max_delay`}}},
		{"unknown target field lists the type's fields", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:t", "subject": "x"}`), []want{{"routes[0].target.subject", `unknown field "subject"; the fields of an sns target are type, timeout, concurrency, topic_arn, message_group_id`}}},
		{"unknown target field of an unknown type lists every field", routeTo(`{"type": "kafka", "brokers": "b"}`), []want{{"routes[0].target.brokers", `the fields of a target are type, timeout, concurrency, topic_arn, message_group_id, event_bus, source, detail_type, url, signing_secret_env, signing_secret_arn, headers, allow_insecure_http, function`}, {"routes[0].target.type", `must be "sns", "eventbridge", "http" or "lambda"; got "kafka"`}}},
		{"misspelt field", routeTo(`{"type": "sns", "topic_ar": "arn:aws:sns:eu-west-1:123456789012:t"}`), []want{{"routes[0].target.topic_ar", `unknown field "topic_ar" (did you mean "topic_arn"?); the fields of an sns target are`}, {"routes[0].target.topic_arn", "is required"}}},
		{"misspelt secret reference", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_evn": "S"}`), []want{{"routes[0].target", "needs signing_secret_env or signing_secret_arn"}, {"routes[0].target.signing_secret_evn", `unknown field "signing_secret_evn" (did you mean "signing_secret_env"?)`}}},
		{"field name in the wrong case", routeTo(`{"type": "sns", "Topic_ARN": "arn:aws:sns:eu-west-1:123456789012:t"}`), []want{{"routes[0].target.Topic_ARN", `(did you mean "topic_arn"? names are case-sensitive)`}}},
		{"odd field name is quoted in the path", routeTo(snsTarget, `"my field": 1`), []want{{`routes[0]["my field"]`, `unknown field "my field"`}}},
		{"inline signing secret", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "signing_secret": "whsec_abc"}`), []want{{"routes[0].target.signing_secret", "secrets are referenced with signing_secret_env or signing_secret_arn, never inline"}}},
		{"inline password", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "password": "hunter2"}`), []want{{"routes[0].target.password", "never inline"}}},
		{"inline api key", routeTo(`{"type": "lambda", "function": "f", "api_key": "k"}`), []want{{"routes[0].target.api_key", "never inline"}}},
		{"inline token on the route", routeTo(snsTarget, `"token": "t"`), []want{{"routes[0].token", "never inline"}}},
		{"inline secret", routeTo(`{"type": "http", "url": "https://h.example/x", "secret": "s"}`), []want{{"routes[0].target", "needs signing_secret_env or signing_secret_arn"}, {"routes[0].target.secret", "never inline"}}},

		// Names.
		{"bad name", routeTo(snsTarget, `"name": "billing usage"`), []want{{"routes[0].name", `must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit; got "billing usage"`}}},
		{"name not a string", routeTo(snsTarget, `"name": 7`), []want{{"routes[0].name", "must be a string, not the number 7"}}},

		// Match.
		{"missing match", `{"target": ` + snsTarget + `}`, []want{{"routes[0].match", `is required`}}},
		{"match not an object", `{"match": "payments/*", "target": ` + snsTarget + `}`, []want{{"routes[0].match", `must be an object, not the string "payments/*"`}}},
		{"missing namespace", `{"match": {"topic": "tp"}, "target": ` + snsTarget + `}`, []want{{"routes[0].match.namespace", `is required`}}},
		{"missing topic", `{"match": {"namespace": "ns"}, "target": ` + snsTarget + `}`, []want{{"routes[0].match.topic", `is required`}}},
		{"invalid namespace", `{"match": {"namespace": "-billing", "topic": "tp"}, "target": ` + snsTarget + `}`, []want{{"routes[0].match.namespace", `must be "*" or an exact name: 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit; got "-billing"`}}},
		{"namespace too long", `{"match": {"namespace": "` + longName + `", "topic": "tp"}, "target": ` + snsTarget + `}`, []want{{"routes[0].match.namespace", `must be "*" or an exact name`}}},
		{"partial wildcard topic", `{"match": {"namespace": "ns", "topic": "usage_*"}, "target": ` + snsTarget + `}`, []want{{"routes[0].match.topic", `is a partial wildcard, which is not supported: write "*" or an exact name; got "usage_*"`}}},

		// Target, common.
		{"missing target", `{"match": {"namespace": "ns", "topic": "tp"}}`, []want{{"routes[0].target", "is required"}}},
		{"missing type", routeTo(`{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:t"}`), []want{{"routes[0].target.type", "is required"}}},
		{"unknown type", routeTo(`{"type": "SNS"}`), []want{{"routes[0].target.type", `must be "sns", "eventbridge", "http" or "lambda"; got "SNS"`}}},
		{"sns field on an http target", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:t"}`), []want{{"routes[0].target.topic_arn", "is a field of sns targets, not of an http target"}}},
		{"http fields on an sns target", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:t", "url": "https://h.example/x", "allow_insecure_http": true}`), []want{{"routes[0].target.allow_insecure_http", "is a field of http targets, not of an sns target"}, {"routes[0].target.url", "is a field of http targets, not of an sns target"}}},
		{"lambda field on an eventbridge target", routeTo(`{"type": "eventbridge", "event_bus": "default", "function": "f"}`), []want{{"routes[0].target.function", "is a field of lambda targets, not of an eventbridge target"}}},
		{"eventbridge field on a lambda target", routeTo(`{"type": "lambda", "function": "f", "event_bus": "default"}`), []want{{"routes[0].target.event_bus", "is a field of eventbridge targets, not of a lambda target"}}},

		// SNS.
		{"sns without topic_arn", routeTo(`{"type": "sns"}`), []want{{"routes[0].target.topic_arn", "is required"}}},
		{"topic_arn not an ARN", routeTo(`{"type": "sns", "topic_arn": "payments"}`), []want{{"routes[0].target.topic_arn", `must be an SNS topic ARN: arn:<partition>:sns:<region>:<12-digit account>:<topic name>; got "payments"`}}},
		{"topic_arn of another service", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sqs:eu-west-1:123456789012:q"}`), []want{{"routes[0].target.topic_arn", `must be an SNS topic ARN: arn:<partition>:sns:`}}},
		{"topic_arn with an unknown partition", routeTo(`{"type": "sns", "topic_arn": "arn:aws-iso:sns:us-iso-east-1:123456789012:t"}`), []want{{"routes[0].target.topic_arn", `must have the partition aws, aws-cn or aws-us-gov; got "arn:aws-iso:sns:us-iso-east-1:123456789012:t"`}}},
		{"topic_arn without a region", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns::123456789012:t"}`), []want{{"routes[0].target.topic_arn", `must have a region name such as eu-west-1`}}},
		{"topic_arn region outside its partition", routeTo(`{"type": "sns", "topic_arn": "arn:aws-cn:sns:eu-west-1:123456789012:t"}`), []want{{"routes[0].target.topic_arn", `has a region outside its partition: cn-* regions are in aws-cn, us-gov-* regions in aws-us-gov, the others in aws`}}},
		{"topic_arn China region in the aws partition", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:cn-north-1:123456789012:t"}`), []want{{"routes[0].target.topic_arn", `has a region outside its partition`}}},
		{"topic_arn short account", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:1234:payments"}`), []want{{"routes[0].target.topic_arn", `must have a 12-digit account id; got "arn:aws:sns:eu-west-1:1234:payments"`}}},
		{"topic_arn bad topic name", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:pay/ments"}`), []want{{"routes[0].target.topic_arn", `must end in a topic name: 1-256 letters, digits, - and _, with .fifo at the end of a FIFO topic`}}},
		{"topic_arn name too long", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:` + strings.Repeat("t", 253) + `.fifo"}`), []want{{"routes[0].target.topic_arn", `must end in a topic name`}}},
		{"message_group_id on a standard topic", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:orders", "message_group_id": "g"}`), []want{{"routes[0].target.message_group_id", "is only for FIFO topics (names ending in .fifo)"}}},
		{"message_group_id too long", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:p.fifo", "message_group_id": "` + strings.Repeat("g", 129) + `"}`), []want{{"routes[0].target.message_group_id", "must be 1-128 printable ASCII characters without spaces"}}},
		{"message_group_id with a space", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:p.fifo", "message_group_id": "a b"}`), []want{{"routes[0].target.message_group_id", "printable ASCII characters without spaces"}}},

		// EventBridge.
		{"eventbridge without event_bus", routeTo(`{"type": "eventbridge"}`), []want{{"routes[0].target.event_bus", `is required`}}},
		{"event_bus bad name", routeTo(`{"type": "eventbridge", "event_bus": "my bus"}`), []want{{"routes[0].target.event_bus", `must be a bus name (1-256 letters, digits and / . - _) or an event bus ARN; got "my bus"`}}},
		{"event_bus name too long", routeTo(`{"type": "eventbridge", "event_bus": "` + strings.Repeat("b", 257) + `"}`), []want{{"routes[0].target.event_bus", "must be a bus name"}}},
		{"event_bus ARN of a rule", routeTo(`{"type": "eventbridge", "event_bus": "arn:aws:events:eu-west-1:123456789012:rule/r"}`), []want{{"routes[0].target.event_bus", "must end in event-bus/<name>"}}},
		{"event_bus ARN of another service", routeTo(`{"type": "eventbridge", "event_bus": "arn:aws:sns:eu-west-1:123456789012:event-bus/b"}`), []want{{"routes[0].target.event_bus", `must be an event bus ARN: arn:<partition>:events:<region>:<12-digit account>:event-bus/<name>`}}},
		{"unknown placeholder in source", routeTo(`{"type": "eventbridge", "event_bus": "default", "source": "outbox.{tenant}"}`), []want{{"routes[0].target.source", `may hold only the placeholders {namespace} and {topic}: no other braces, no control characters; got "outbox.{tenant}"`}}},
		{"unknown placeholder in detail_type", routeTo(`{"type": "eventbridge", "event_bus": "default", "detail_type": "{Topic}"}`), []want{{"routes[0].target.detail_type", `may hold only the placeholders {namespace} and {topic}`}}},
		{"unclosed brace", routeTo(`{"type": "eventbridge", "event_bus": "default", "source": "outbox.{namespace"}`), []want{{"routes[0].target.source", `may hold only the placeholders {namespace} and {topic}`}}},
		{"stray closing brace", routeTo(`{"type": "eventbridge", "event_bus": "default", "detail_type": "topic}"}`), []want{{"routes[0].target.detail_type", `may hold only the placeholders {namespace} and {topic}`}}},
		{"source reserved by AWS", routeTo(`{"type": "eventbridge", "event_bus": "default", "source": "aws.outbox"}`), []want{{"routes[0].target.source", `starts with "aws.": AWS reserves that prefix`}}},
		{"source that expands into aws.", `{"match": {"namespace": "aws.billing", "topic": "*"}, "target": {"type": "eventbridge", "event_bus": "default", "source": "{namespace}"}}`, []want{{"routes[0].target.source", `"{namespace}" expands to "aws.billing" for this route, which starts with "aws."`}}},
		{"detail_type too long", routeTo(`{"type": "eventbridge", "event_bus": "default", "detail_type": "` + strings.Repeat("d", 127) + `.{topic}"}`), []want{{"routes[0].target.detail_type", "expands to 130 characters, over EventBridge's limit of 128"}}},
		{"source too long", routeTo(`{"type": "eventbridge", "event_bus": "default", "source": "` + strings.Repeat("s", 257) + `"}`), []want{{"routes[0].target.source", "expands to 257 characters, over EventBridge's limit of 256"}}},

		// HTTP.
		{"http without url", routeTo(`{"type": "http", "signing_secret_env": "S"}`), []want{{"routes[0].target.url", "is required"}}},
		{"relative url", routeTo(`{"type": "http", "url": "/usage", "signing_secret_env": "S"}`), []want{{"routes[0].target.url", "is not an absolute URL such as https://billing.internal/usage"}}},
		{"unparsable url", routeTo(`{"type": "http", "url": "https://bad host/", "signing_secret_env": "S"}`), []want{{"routes[0].target.url", `is not a URL: invalid character " " in host name`}}},
		{"ftp url", routeTo(`{"type": "http", "url": "ftp://h.example/x", "signing_secret_env": "S"}`), []want{{"routes[0].target.url", `has scheme "ftp"; use https://`}}},
		{"plain http to a remote host", routeTo(`{"type": "http", "url": "http://billing.internal/usage", "signing_secret_env": "S"}`), []want{{"routes[0].target.url", "uses http:// to billing.internal, which sends messages unencrypted; use https://, or set allow_insecure_http: true"}}},
		{"credentials in the url", routeTo(`{"type": "http", "url": "https://user:hunter2@h.example/x", "signing_secret_env": "S"}`), []want{{"routes[0].target.url", "contains credentials (user:password@); secrets are referenced with signing_secret_env or signing_secret_arn, never inline"}}},
		{"token in the query", routeTo(`{"type": "http", "url": "https://h.example/x?access_token=abc", "signing_secret_env": "S"}`), []want{{"routes[0].target.url", `has the query parameter "access_token", which would carry a credential inline`}}},
		{"fragment in the url", routeTo(`{"type": "http", "url": "https://h.example/x#part", "signing_secret_env": "S"}`), []want{{"routes[0].target.url", "has a #fragment, which is never sent"}}},
		{"no signing secret", routeTo(`{"type": "http", "url": "https://h.example/x"}`), []want{{"routes[0].target", "needs signing_secret_env or signing_secret_arn: webhooks are always signed"}}},
		{"both signing secrets", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "signing_secret_arn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:s"}`), []want{{"routes[0].target", "sets both signing_secret_env and signing_secret_arn; set exactly one"}}},
		{"signing_secret_env not a variable name", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw+X=="}`), []want{{"routes[0].target.signing_secret_env", "must be the name of an environment variable (letters, digits and _, not starting with a digit); the secret itself goes in that variable"}}},
		{"signing_secret_env starting with a digit", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "1SECRET"}`), []want{{"routes[0].target.signing_secret_env", "must be the name of an environment variable"}}},
		{"signing_secret_arn of another service", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_arn": "arn:aws:ssm:eu-west-1:123456789012:parameter/s"}`), []want{{"routes[0].target.signing_secret_arn", `must be a Secrets Manager secret ARN: arn:<partition>:secretsmanager:<region>:<12-digit account>:secret:<name>`}}},
		{"signing_secret_arn not a secret", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_arn": "arn:aws:secretsmanager:eu-west-1:123456789012:s"}`), []want{{"routes[0].target.signing_secret_arn", "must end in secret:<name>"}}},
		{"header with a bad name", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"X Team": "billing"}}`), []want{{`routes[0].target.headers["X Team"]`, `is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_` + "`" + `|~)`}}},
		{"header with a CRLF", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"X-Team": "a\r\nX-Admin: 1"}}`), []want{{"routes[0].target.headers.X-Team", "has a value with a control character"}}},
		{"header value not a string", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"X-Team": 1}}`), []want{{"routes[0].target.headers.X-Team", "must be a string, not the number 1"}}},
		{"authorization header", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"Authorization": "Bearer abc"}}`), []want{{"routes[0].target.headers.Authorization", "would carry a credential inline; secrets are referenced with signing_secret_env or signing_secret_arn, never inline"}}},
		{"api key header", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"X-Api-Key": "abc"}}`), []want{{"routes[0].target.headers.X-Api-Key", "never inline"}}},
		{"CloudEvents attribute header", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"Ce-Source": "/forged"}}`), []want{{"routes[0].target.headers.Ce-Source", "is reserved: the dispatcher sets it"}}},
		{"headers differing in case", routeTo(`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"X-Team": "a", "x-team": "b"}}`), []want{{"routes[0].target.headers.x-team", `is the same header as "X-Team" (header names are case-insensitive)`}}},

		// Lambda.
		{"lambda without function", routeTo(`{"type": "lambda"}`), []want{{"routes[0].target.function", "is required"}}},
		{"function name with a space", routeTo(`{"type": "lambda", "function": "audit sink"}`), []want{{"routes[0].target.function", `must be a function name (1-64 letters, digits, - and _), <12-digit account>:function:<name> or a function ARN, each with an optional :<qualifier> ($LATEST, a version or an alias); got "audit sink"`}}},
		{"function name too long", routeTo(`{"type": "lambda", "function": "` + strings.Repeat("f", 65) + `"}`), []want{{"routes[0].target.function", "must be a function name"}}},
		{"function ARN of another service", routeTo(`{"type": "lambda", "function": "arn:aws:states:eu-west-1:123456789012:stateMachine:s"}`), []want{{"routes[0].target.function", `must be a Lambda function ARN: arn:<partition>:lambda:`}}},
		{"lambda ARN that is not a function", routeTo(`{"type": "lambda", "function": "arn:aws:lambda:eu-west-1:123456789012:layer:l"}`), []want{{"routes[0].target.function", "must end in function:<name>[:<qualifier>]"}}},
		{"function ARN with a short account", routeTo(`{"type": "lambda", "function": "arn:aws:lambda:eu-west-1:1234:function:f"}`), []want{{"routes[0].target.function", `must have a 12-digit account id`}}},
		{"bad qualifier", routeTo(`{"type": "lambda", "function": "arn:aws:lambda:eu-west-1:123456789012:function:f:v1.2"}`), []want{{"routes[0].target.function", `must end in function:<name>[:<qualifier>], the name 1-64 letters, digits, - and _, the qualifier $LATEST, a version or an alias; got "arn:aws:lambda:eu-west-1:123456789012:function:f:v1.2"`}}},

		// Retry.
		{"max_attempts zero", routeTo(snsTarget, `"retry": {"max_attempts": 0}`), []want{{"routes[0].retry.max_attempts", "must be at least 1; got 0"}}},
		{"max_attempts negative", routeTo(snsTarget, `"retry": {"max_attempts": -3}`), []want{{"routes[0].retry.max_attempts", "must be at least 1; got -3"}}},
		{"max_attempts over the ceiling", routeTo(snsTarget, `"retry": {"max_attempts": 101}`), []want{{"routes[0].retry.max_attempts", "must be at most 100 (the database's attempt ceiling), got 101"}}},
		{"max_attempts as a string", routeTo(snsTarget, `"retry": {"max_attempts": "12"}`), []want{{"routes[0].retry.max_attempts", `must be an integer, not the string "12"`}}},
		{"max_attempts fractional", routeTo(snsTarget, `"retry": {"max_attempts": 1.5}`), []want{{"routes[0].retry.max_attempts", "must be an integer, not the number 1.5"}}},
		{"base_delay unparsable", routeTo(snsTarget, `"retry": {"base_delay": "1 second"}`), []want{{"routes[0].retry.base_delay", `must be a duration such as "500ms", "30s", "15m" or "1h30m"; got "1 second"`}}},
		{"base_delay negative", routeTo(snsTarget, `"retry": {"base_delay": "-1s"}`), []want{{"routes[0].retry.base_delay", `must be a duration such as "500ms", "30s", "15m" or "1h30m"; got "-1s"`}}},
		{"max_delay negative", routeTo(snsTarget, `"retry": {"max_delay": "-5m"}`), []want{{"routes[0].retry.max_delay", `must be a duration such as "500ms", "30s", "15m" or "1h30m"; got "-5m"`}}},
		{"max_delay as a number", routeTo(snsTarget, `"retry": {"max_delay": 900}`), []want{{"routes[0].retry.max_delay", "must be a string, not the number 900"}}},
		{"max_delay below base_delay", routeTo(snsTarget, `"retry": {"base_delay": "10s", "max_delay": "5s"}`), []want{{"routes[0].retry.max_delay", "is 5s, less than base_delay 10s; max_delay must be at least base_delay"}}},
		{"default max_delay below base_delay", routeTo(snsTarget, `"retry": {"base_delay": "1h"}`), []want{{"routes[0].retry.max_delay", "is 15m (the default), less than base_delay 1h"}}},
		{"retry not an object", routeTo(snsTarget, `"retry": 3`), []want{{"routes[0].retry", "must be an object, not the number 3"}}},

		// Timeout.
		{"zero timeout", routeTo(`{"type": "lambda", "function": "f", "timeout": "0s"}`), []want{{"routes[0].target.timeout", "must be positive, got 0s"}}},
		{"negative timeout", routeTo(`{"type": "lambda", "function": "f", "timeout": "-1s"}`), []want{{"routes[0].target.timeout", `must be a duration such as "500ms", "30s", "15m" or "1h30m"; got "-1s"`}}},
		{"timeout over 5m", routeTo(`{"type": "lambda", "function": "f", "timeout": "6m"}`), []want{{"routes[0].target.timeout", "must be at most 5m, got 6m"}}},
		{"timeout unparsable", routeTo(`{"type": "lambda", "function": "f", "timeout": "5"}`), []want{{"routes[0].target.timeout", `must be a duration such as "500ms", "30s", "15m" or "1h30m"; got "5"`}}},
		{"timeout as a number", routeTo(`{"type": "lambda", "function": "f", "timeout": 5}`), []want{{"routes[0].target.timeout", "must be a string, not the number 5"}}},

		// Payload size.
		{"max_payload_bytes zero", routeTo(snsTarget, `"max_payload_bytes": 0`), []want{{"routes[0].max_payload_bytes", "must be from 1 to 10485760 (10 MiB); got 0"}}},
		{"max_payload_bytes negative", routeTo(snsTarget, `"max_payload_bytes": -1`), []want{{"routes[0].max_payload_bytes", "must be from 1 to 10485760 (10 MiB); got -1"}}},
		{"max_payload_bytes over sns", routeTo(snsTarget, `"max_payload_bytes": 1048577`), []want{{"routes[0].max_payload_bytes", "must be at most 1048576 (1 MiB) for an sns target without offload; got 1048577"}}},
		{"max_payload_bytes over eventbridge", routeTo(ebTarget, `"max_payload_bytes": 1048577`), []want{{"routes[0].max_payload_bytes", "must be at most 1048576 (1 MiB) for an eventbridge target without offload; got 1048577"}}},
		{"max_payload_bytes over http", routeTo(httpTarget, `"max_payload_bytes": 10485761`), []want{{"routes[0].max_payload_bytes", "must be from 1 to 10485760 (10 MiB); got 10485761"}}},
		{"max_payload_bytes over lambda", routeTo(lambdaTarget, `"max_payload_bytes": 6291457`), []want{{"routes[0].max_payload_bytes", "must be at most 6291456 (6 MiB) for a lambda target without offload; got 6291457"}}},
		{"max_payload_bytes over 10 MiB, offloaded", routeTo(snsTarget, `"max_payload_bytes": 10485761, "offload": {"bucket": "b-1"}`), []want{{"routes[0].max_payload_bytes", "must be from 1 to 10485760 (10 MiB); got 10485761"}}},
		{"offload without bucket", routeTo(snsTarget, `"offload": {"threshold_bytes": 1000}`), []want{{"routes[0].offload.bucket", "is required"}}},
		{"offload bad bucket", routeTo(snsTarget, `"offload": {"bucket": "My_Bucket"}`), []want{{"routes[0].offload.bucket", "must be an S3 bucket name"}}},
		{"offload unknown field", routeTo(snsTarget, `"offload": {"bucket": "b-1", "ttl": "1h"}`), []want{{"routes[0].offload.ttl", "unknown field"}}},
		{"format unknown", routeTo(snsTarget, `"format": "cloudevent"`), []want{{"routes[0].format", `must be "cloudevents" (leave format out for the target's own format)`}}},
		{"format with offload", routeTo(snsTarget, `"format": "cloudevents", "offload": {"bucket": "b-1"}`), []want{{"routes[0].format", "cannot be combined with offload"}}},
		{"cloudevents without format", routeTo(httpTarget, `"cloudevents": {"source": "/s"}`), []want{{"routes[0].cloudevents", `format is not "cloudevents"`}}},
		{"format unknown, with cloudevents", routeTo(httpTarget, `"format": "ce", "cloudevents": {"source": "/s"}`), []want{{"routes[0].format", `must be "cloudevents"`}}},
		{"cloudevents unknown field", routeTo(httpTarget, `"format": "cloudevents", "cloudevents": {"type": "t"}`), []want{{"routes[0].cloudevents.type", "unknown field"}}},
		{"cloudevents source with a space", routeTo(lambdaTarget, `"format": "cloudevents", "cloudevents": {"source": "/a b"}`), []want{{"routes[0].cloudevents.source", "must be 1-1024 characters of a URI reference"}}},
		{"cloudevents source with an unknown placeholder", routeTo(ebTarget, `"format": "cloudevents", "cloudevents": {"source": "/{tenant}"}`), []want{{"routes[0].cloudevents.source", "unknown placeholder"}}},
		{"offload threshold zero", routeTo(snsTarget, `"offload": {"bucket": "b-1", "threshold_bytes": 0}`), []want{{"routes[0].offload.threshold_bytes", "must be at least 1"}}},
		{"max_payload_bytes overflowing", routeTo(lambdaTarget, `"max_payload_bytes": 1e30`), []want{{"routes[0].max_payload_bytes", "must be from 1 to 10485760 (10 MiB); got 1e30"}}},
		{"max_payload_bytes too large", routeTo(lambdaTarget, `"max_payload_bytes": 99999999999999999999`), []want{{"routes[0].max_payload_bytes", "must be from 1 to 10485760 (10 MiB); got 99999999999999999999"}}},

		// Schema.
		{"schema a string", routeTo(snsTarget, `"schema": "object"`), []want{{"routes[0].schema", `must be a boolean or an object, not the string "object"`}}},
		{"schema a list", routeTo(snsTarget, `"schema": [{"type": "object"}]`), []want{{"routes[0].schema", "must be a boolean or an object, not a list"}}},
		{"schema that does not compile", routeTo(snsTarget, `"schema": {"type": "objekt"}`), []want{{"routes[0].schema", "is not a valid JSON Schema: at /type: value must be one of 'array', 'boolean', 'integer', 'null', 'number', 'object', 'string'"}}},
		{"schema with a bad pattern", routeTo(snsTarget, `"schema": {"pattern": "(?=lookahead)"}`), []want{{"routes[0].schema", "is not a valid JSON Schema: at /pattern: '(?=lookahead)' is not valid regex"}}},
		{"schema with a dangling local ref", routeTo(snsTarget, `"schema": {"$ref": "#/$defs/missing"}`), []want{{"routes[0].schema", `does not compile: json-pointer in "#/$defs/missing" not found`}}},
		{"schema with a remote ref", routeTo(snsTarget, `"schema": {"$ref": "https://schemas.example.com/usage.json"}`), []want{{"routes[0].schema", `failing loading "https://schemas.example.com/usage.json": references outside the route's own schema are not loaded; put the referenced schema under $defs`}}},
		{"schema with a relative ref", routeTo(snsTarget, `"schema": {"$ref": "common.json#/$defs/money"}`), []want{{"routes[0].schema", `failing loading "common.json": references outside the route's own schema are not loaded`}}},
		{"schema with a file ref", routeTo(snsTarget, `"schema": {"$ref": "file:///etc/passwd"}`), []want{{"routes[0].schema", "references outside the route's own schema are not loaded"}}},
		{"schema with a remote metaschema", routeTo(snsTarget, `"schema": {"$schema": "https://schemas.example.com/meta.json", "type": "object"}`), []want{{"routes[0].schema", "references outside the route's own schema are not loaded"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkProblems(t, config(tc.route), tc.want...)
		})
	}
}

func TestParseRejectsDuplicates(t *testing.T) {
	t.Parallel()
	t.Run("same match", func(t *testing.T) {
		t.Parallel()
		checkProblems(t, config(
			`{"match": {"namespace": "payments", "topic": "*"}, "target": `+snsTarget+`}`,
			`{"match": {"namespace": "audit", "topic": "*"}, "target": `+lambdaTarget+`}`,
			`{"match": {"namespace": "payments", "topic": "*"}, "target": `+ebTarget+`}`,
		), want{"routes[2].match", `namespace "payments" and topic "*" are already matched by routes[0]; each pair of patterns may appear once`})
	})
	t.Run("same name", func(t *testing.T) {
		t.Parallel()
		checkProblems(t, config(
			`{"name": "billing", "match": {"namespace": "a", "topic": "*"}, "target": `+snsTarget+`}`,
			`{"name": "billing", "match": {"namespace": "b", "topic": "*"}, "target": `+snsTarget+`}`,
		), want{"routes[1].name", `"billing" is already the name of routes[0]; names must be unique`})
	})
}

func TestParseReportsEveryProblem(t *testing.T) {
	t.Parallel()
	data := `{"routes": [
	  {"match": {"namespace": "payments", "topic": "*"},
	   "target": {"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:1234:payments", "message_group_id": "p"}},
	  {"match": {"namespace": "billing", "topic": "usage"},
	   "target": {"type": "http", "url": "http://billing.internal/usage", "signing_secret": "whsec_x"},
	   "retry": {"max_attempts": 500, "base_delay": "soon"}},
	  {"match": {"namespace": "*", "topic": "*"},
	   "target": {"type": "eventbridge", "event_bus": "default", "source": "aws.{topic}", "tiemout": "5s"}},
	  {"match": {"namespace": "payments", "topic": "*"},
	   "target": {"type": "lambda", "function": "payments-sink", "timeout": "10m"},
	   "max_payload_bytes": 0}
	], "version": 2}`
	checkProblems(t, data,
		want{"version", `unknown field "version"`},
		want{"routes[0].target.message_group_id", "is only for FIFO topics"},
		want{"routes[0].target.topic_arn", `must have a 12-digit account id; got "arn:aws:sns:eu-west-1:1234:payments"`},
		want{"routes[1].retry.base_delay", `must be a duration such as "500ms", "30s", "15m" or "1h30m"; got "soon"`},
		want{"routes[1].retry.max_attempts", "must be at most 100"},
		want{"routes[1].target", "needs signing_secret_env or signing_secret_arn"},
		want{"routes[1].target.signing_secret", "never inline"},
		want{"routes[1].target.url", "uses http:// to billing.internal"},
		want{"routes[2].target.source", `starts with "aws."`},
		want{"routes[2].target.tiemout", `unknown field "tiemout" (did you mean "timeout"?); the fields of an eventbridge target are type, timeout, concurrency, event_bus, source, detail_type`},
		want{"routes[3].match", "already matched by routes[0]"},
		want{"routes[3].max_payload_bytes", "must be from 1 to 10485760 (10 MiB); got 0"},
		want{"routes[3].target.timeout", "must be at most 5m, got 10m"},
	)
}

// The attempt ceiling bounds max_attempts both ways: a deployment that
// lowers it refuses the routes above it, one that raises it admits them.
func TestParseBoundsMaxAttemptsByTheAttemptCeiling(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ceiling  int
		attempts string
		problem  string // "" for none
	}{
		{0, "100", ""},
		{0, "101", "must be at most 100 (the database's attempt ceiling), got 101"},
		{50, "50", ""},
		{50, "80", "must be at most 50 (the database's attempt ceiling), got 80"},
		{1000, "500", ""},
		{1000, "1000", ""},
		{1000, "1001", "must be at most 1000 (the database's attempt ceiling), got 1001"},
		{1000, "1e20", "must be at most 1000 (the database's attempt ceiling), got 100000000000000000000"},
	} {
		data := config(routeTo(snsTarget, `"retry": {"max_attempts": `+tc.attempts+`}`))
		table, err := Parse([]byte(data), Options{AttemptCeiling: tc.ceiling})
		if tc.problem == "" {
			if err != nil {
				t.Errorf("ceiling %d, max_attempts %s: %v", tc.ceiling, tc.attempts, err)
			} else if got := strconv.Itoa(table.Routes[0].Retry.MaxAttempts); got != tc.attempts {
				t.Errorf("ceiling %d: MaxAttempts %s, want %s", tc.ceiling, got, tc.attempts)
			}
			continue
		}
		ce, ok := errors.AsType[*ConfigError](err)
		if !ok || len(ce.Problems) != 1 || ce.Problems[0].String() != "routes[0].retry.max_attempts: "+tc.problem {
			t.Errorf("ceiling %d, max_attempts %s: err = %v\nwant routes[0].retry.max_attempts: %s", tc.ceiling, tc.attempts, err, tc.problem)
		}
	}
}

// A value that may be a credential is never quoted in an error, whatever
// rule it breaks.
func TestParseNeverQuotesASecret(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-V4LU3"
	for _, target := range []string{
		`{"type": "http", "url": "https://user:` + secret + `@h.example/x", "signing_secret_env": "S"}`,
		`{"type": "http", "url": "https://h.example/x?api_key=` + secret + `", "signing_secret_env": "S"}`,
		`{"type": "http", "url": "/hooks/` + secret + `", "signing_secret_env": "S"}`,
		`{"type": "http", "url": "ftp://h.example/` + secret + `", "signing_secret_env": "S"}`,
		`{"type": "http", "url": "https://bad host/` + secret + `", "signing_secret_env": "S"}`,
		`{"type": "http", "url": "https://h.example/x#` + secret + `", "signing_secret_env": "S"}`,
		`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "whsec_` + secret + `"}`,
		`{"type": "http", "url": "https://h.example/x", "signing_secret": "` + secret + `"}`,
		`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"Authorization": "Bearer ` + secret + `"}}`,
		`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"X-Team": "` + secret + `\r\n"}}`,
		`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"X Team": "` + secret + `"}}`,
		`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": {"Host": "` + secret + `"}}`,
		`{"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "headers": "Authorization: Bearer ` + secret + `"}`,
		`{"type": "http", "url": {"href": "https://h.example/` + secret + `"}, "signing_secret_env": "S"}`,
		`{"type": "lambda", "function": "f", "token": "` + secret + `"}`,
		`{"type": "lambda", "function": "f", "url": "https://` + secret + `@h"}`,
	} {
		_, err := Parse([]byte(config(routeTo(target))), Options{})
		if err == nil {
			t.Errorf("Parse accepted %s", target)
		} else if strings.Contains(err.Error(), secret) {
			t.Errorf("the error quotes the secret:\n%v", err)
		}
	}
}

func TestParseAcceptsValidTargets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, route string }{
		{"sns standard", routeTo(snsTarget)},
		{"sns fifo with a group", routeTo(fifoTarget)},
		{"sns fifo without a group", routeTo(`{"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:p.fifo"}`)},
		{"sns China", routeTo(`{"type": "sns", "topic_arn": "arn:aws-cn:sns:cn-north-1:123456789012:t"}`)},
		{"sns GovCloud", routeTo(`{"type": "sns", "topic_arn": "arn:aws-us-gov:sns:us-gov-west-1:123456789012:t"}`)},
		{"eventbridge bus ARN", routeTo(`{"type": "eventbridge", "event_bus": "arn:aws:events:eu-west-1:123456789012:event-bus/orders"}`)},
		{"eventbridge partner bus", routeTo(`{"type": "eventbridge", "event_bus": "aws.partner/example.com/123/orders"}`)},
		{"eventbridge templates", routeTo(`{"type": "eventbridge", "event_bus": "default", "source": "com.example.{namespace}", "detail_type": "{namespace}.{topic}.v1"}`)},
		{"http to localhost", routeTo(`{"type": "http", "url": "http://localhost:8080/hook", "signing_secret_env": "S"}`)},
		{"http to 127.0.0.1", routeTo(`{"type": "http", "url": "http://127.0.0.1:8080/hook", "signing_secret_env": "S"}`)},
		{"http to ::1", routeTo(`{"type": "http", "url": "http://[::1]:8080/hook", "signing_secret_env": "S"}`)},
		{"http with allow_insecure_http", routeTo(`{"type": "http", "url": "http://billing.internal/usage", "signing_secret_env": "S", "allow_insecure_http": true}`)},
		{"http with a secret ARN and headers", routeTo(`{"type": "http", "url": "https://h.example/x?tenant=1", "signing_secret_arn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:billing/webhook-AbCdEf", "headers": {"X-Team": "billing", "X-Env": "prod\tblue"}}`)},
		{"lambda name with qualifier", routeTo(`{"type": "lambda", "function": "audit-sink:live"}`)},
		{"lambda partial ARN", routeTo(`{"type": "lambda", "function": "123456789012:function:audit-sink"}`)},
		{"lambda full ARN with version", routeTo(`{"type": "lambda", "function": "arn:aws:lambda:eu-west-1:123456789012:function:audit-sink:42"}`)},
		{"lambda full ARN with $LATEST", routeTo(`{"type": "lambda", "function": "arn:aws:lambda:eu-west-1:123456789012:function:audit-sink:$LATEST"}`)},
		{"payload limit at the maximum", routeTo(lambdaTarget, `"max_payload_bytes": 6291456`)},
		{"boolean schema", routeTo(lambdaTarget, `"schema": true`)},
		{"draft-07 schema", routeTo(lambdaTarget, `"schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}`)},
		{"schema with local refs", routeTo(lambdaTarget, `"schema": {"$defs": {"money": {"type": "integer"}}, "properties": {"amount": {"$ref": "#/$defs/money"}}}`)},
		{"nulls are absent", routeTo(lambdaTarget, `"name": null, "retry": null, "schema": null, "max_payload_bytes": null`)},
		{"zero base delay", routeTo(lambdaTarget, `"retry": {"base_delay": "0s", "max_delay": "0s"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Parse([]byte(config(tc.route)), Options{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// An empty string or false is an absent field, as null is: configurations
// written from templates set them, and they have always been accepted.
func TestParseReadsEmptyValuesAsAbsent(t *testing.T) {
	t.Parallel()
	table, err := Parse([]byte(config(
		`{"name": "", "match": {"namespace": "a", "topic": "*"}, "target": {"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:orders", "message_group_id": "", "url": "", "allow_insecure_http": false}}`,
		`{"match": {"namespace": "b", "topic": "*"}, "target": {"type": "http", "url": "https://h.example/x", "signing_secret_env": "S", "signing_secret_arn": "", "headers": {"X-Empty": ""}}}`,
		`{"match": {"namespace": "c", "topic": "*"}, "target": {"type": "eventbridge", "event_bus": "default", "source": "", "detail_type": "", "function": ""}}`,
		`{"match": {"namespace": "d", "topic": "*"}, "target": {"type": "lambda", "function": "f"}, "retry": false, "on_dead": ""}`,
	)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := table.Routes[0]; r.Name != "routes[0]" || r.Target.MessageGroupID != "" {
		t.Errorf("routes[0] = %s, %+v", r.Name, r.Target)
	}
	if v, ok := table.Routes[1].Target.Headers["X-Empty"]; !ok || v != "" {
		t.Errorf("the empty header is lost: %v", table.Routes[1].Target.Headers)
	}
	if eb := table.Routes[2].Target; eb.Source != DefaultSource || eb.DetailType != DefaultDetailType {
		t.Errorf("eventbridge templates %q, %q; want the defaults", eb.Source, eb.DetailType)
	}
	checkProblems(t, config(`{"match": {"namespace": "", "topic": "*"}, "target": {"type": ""}}`),
		want{"routes[0].match.namespace", "is required"}, want{"routes[0].target.type", "is required"})
}

func TestParseAppliesDefaults(t *testing.T) {
	t.Parallel()
	table, err := Parse([]byte(config(
		`{"match": {"namespace": "a", "topic": "*"}, "target": `+snsTarget+`}`,
		`{"match": {"namespace": "b", "topic": "*"}, "target": `+ebTarget+`, "retry": {"max_attempts": 3}}`,
		`{"match": {"namespace": "c", "topic": "*"}, "target": `+httpTarget+`, "retry": {"max_delay": "1h"}}`,
		`{"match": {"namespace": "d", "topic": "*"}, "target": `+lambdaTarget+`, "retry": {"base_delay": "2s"}}`,
	)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range []struct {
		retry   backoff.Policy
		payload int
	}{
		{backoff.Default, 262144},
		{backoff.Policy{MaxAttempts: 3, BaseDelay: time.Second, MaxDelay: 15 * time.Minute}, 262144},
		{backoff.Policy{MaxAttempts: 12, BaseDelay: time.Second, MaxDelay: time.Hour}, 1048576},
		{backoff.Policy{MaxAttempts: 12, BaseDelay: 2 * time.Second, MaxDelay: 15 * time.Minute}, 1048576},
	} {
		r := table.Routes[i]
		if r.Index != i || r.Name != fmt.Sprintf("routes[%d]", i) {
			t.Errorf("route %d: Index %d, Name %q", i, r.Index, r.Name)
		}
		if r.Retry != w.retry {
			t.Errorf("route %d: Retry = %+v, want %+v", i, r.Retry, w.retry)
		}
		if err := r.Retry.Validate(); err != nil {
			t.Errorf("route %d: Retry.Validate: %v", i, err)
		}
		if r.Timeout != 10*time.Second || r.Target.Timeout != r.Timeout {
			t.Errorf("route %d: Timeout %s, Target.Timeout %s; want 10s", i, r.Timeout, r.Target.Timeout)
		}
		if r.MaxPayloadBytes != w.payload || r.Target.MaxPayloadBytes != w.payload {
			t.Errorf("route %d: MaxPayloadBytes %d, Target.MaxPayloadBytes %d; want %d", i, r.MaxPayloadBytes, r.Target.MaxPayloadBytes, w.payload)
		}
		if r.HasSchema() || r.Schema != nil || r.CheckPayload([]byte(`"anything"`)) != nil {
			t.Errorf("route %d has a schema", i)
		}
	}
	if eb := table.Routes[1].Target; eb.Source != "outbox.{namespace}" || eb.DetailType != "{topic}" {
		t.Errorf("eventbridge templates = %q, %q; want the defaults", eb.Source, eb.DetailType)
	}
}

// YAML is read as YAML 1.2 (as editors' YAML language server reads it), one
// document, each value as written: an unquoted timestamp stays the string
// written, and yes and no are strings.
func TestParseReadsYAMLAsWritten(t *testing.T) {
	t.Parallel()
	const httpTarget = "{type: http, url: \"https://h.example/x\", signing_secret_env: S"
	table, err := Parse([]byte("routes:\n  - match: {namespace: no, topic: \"*\"}\n    target: "+httpTarget+", headers: {Api-Version: 2024-06-20}}\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := table.Routes[0]; r.Match.Namespace != "no" || r.Target.Headers["Api-Version"] != "2024-06-20" {
		t.Errorf("namespace %q, headers %v; want no and 2024-06-20 as written", r.Match.Namespace, r.Target.Headers)
	}
	routes := "routes:\n  - match: {namespace: a, topic: b}\n    target: "
	for _, tc := range []struct {
		name, data string
		want       want
	}{
		{"a broken document after the first", routes + "{type: lambda, function: f}\n---\nroutes: [\n", want{"", "not valid YAML: yaml: line 5"}},
		{"a YAML 1.1 boolean", routes + httpTarget + ", allow_insecure_http: yes}\n", want{"routes[0].target.allow_insecure_http", `must be true or false, not the string "yes"`}},
		{"a number for a string", routes + "{type: lambda, function: 2024}\n", want{"routes[0].target.function", "must be a string, not the number 2024; YAML reads unquoted true, false and numbers as such: quote the value"}},
		{"a mapping for a string", routes + "{type: eventbridge, event_bus: default, detail_type: {topic}}\n", want{"routes[0].target.detail_type", "must be a string, not an object; in YAML a value that starts with { is a mapping: quote it"}},
		{"a key that is not a string", routes + "{type: lambda, function: f, 3: x}\n", want{"routes[0].target.3", `unknown field "3"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkProblems(t, tc.data, tc.want)
		})
	}
}

// The example routing table, one route of each target type, as JSON and as YAML.
func TestParseJSONAndYAMLGiveEqualTables(t *testing.T) {
	t.Parallel()
	fromJSON := parseFile(t, "testdata/example.json")
	fromYAML := parseFile(t, "testdata/example.yaml")
	if a, b := describeTable(fromJSON), describeTable(fromYAML); a != b {
		t.Fatalf("JSON and YAML tables differ:\nJSON: %s\nYAML: %s", a, b)
	}

	want := []*Route{
		{Index: 0, Name: "billing-usage", Match: Match{"mini-chat", "usage_snapshot"},
			Target: Target{Type: "http", URL: "https://billing.internal/usage", SigningSecretEnv: "BILLING_WEBHOOK_SECRET",
				Headers: map[string]string{"X-Team": "billing"}, Timeout: 5 * time.Second, MaxPayloadBytes: 65536, Concurrency: 8},
			Retry: backoff.Policy{MaxAttempts: 12, BaseDelay: time.Second, MaxDelay: 15 * time.Minute}, Timeout: 5 * time.Second,
			MaxPayloadBytes: 65536, Schema: []byte(`{"required":["tenant_id"],"type":"object"}`), OnDead: OnDeadSkip, OnConfigError: OnConfigErrorHold},
		{Index: 1, Name: "routes[1]", Match: Match{"payments", "*"},
			Target: Target{Type: "sns", TopicARN: "arn:aws:sns:eu-west-1:123456789012:payments.fifo", MessageGroupID: "payments",
				Timeout: 10 * time.Second, MaxPayloadBytes: 262144, Concurrency: 8},
			Retry: backoff.Default, Timeout: 10 * time.Second, MaxPayloadBytes: 262144, OnDead: OnDeadSkip, OnConfigError: OnConfigErrorHold},
		{Index: 2, Name: "routes[2]", Match: Match{"*", "*"},
			Target: Target{Type: "eventbridge", EventBus: "default", Source: "outbox.{namespace}", DetailType: "{topic}",
				Timeout: 10 * time.Second, MaxPayloadBytes: 262144, Concurrency: 8},
			Retry: backoff.Default, Timeout: 10 * time.Second, MaxPayloadBytes: 262144, OnDead: OnDeadSkip, OnConfigError: OnConfigErrorHold},
		{Index: 3, Name: "routes[3]", Match: Match{"audit", "*"},
			Target: Target{Type: "lambda", Function: "arn:aws:lambda:eu-west-1:123456789012:function:audit-sink",
				Timeout: 10 * time.Second, MaxPayloadBytes: 1048576, Concurrency: 8},
			Retry: backoff.Default, Timeout: 10 * time.Second, MaxPayloadBytes: 1048576, OnDead: OnDeadSkip, OnConfigError: OnConfigErrorHold},
	}
	for _, table := range []*Table{fromJSON, fromYAML} {
		if len(table.Routes) != len(want) {
			t.Fatalf("%d routes, want %d", len(table.Routes), len(want))
		}
		for i, r := range table.Routes {
			if r.HasSchema() != (want[i].Schema != nil) {
				t.Errorf("route %d: HasSchema = %v", i, r.HasSchema())
			}
			got := *r
			got.schema = nil
			got.Target.key = ""
			if !reflect.DeepEqual(&got, want[i]) {
				t.Errorf("route %d =\n%+v\nwant\n%+v", i, got, *want[i])
			}
		}
	}
}

func parseFile(t *testing.T, path string) *Table {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	table, err := Parse(data, Options{})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return table
}

// describeTable renders everything a table holds but the compiled schemas.
func describeTable(table *Table) string {
	var b strings.Builder
	for _, r := range table.Routes {
		fmt.Fprintf(&b, "%d %s %s %+v %+v %s %d %s %v key=%s\n", r.Index, r.Name, r.Match, r.Target, r.Retry,
			r.Timeout, r.MaxPayloadBytes, r.Schema, r.HasSchema(), r.Target.Key())
	}
	return b.String()
}

// With offload, max_payload_bytes may exceed the target type's maximum (the
// payload goes to S3); the option is part of the target's key, so routes
// that offload differently get separate publishers.
func TestOffloadLiftsThePayloadCapAndKeysTheTarget(t *testing.T) {
	t.Parallel()
	table, err := Parse([]byte(`{"routes":[
	  {"match":{"namespace":"a","topic":"*"},"max_payload_bytes":5242880,"offload":{"bucket":"b-1","threshold_bytes":1000},
	   "target":{"type":"sns","topic_arn":"arn:aws:sns:eu-west-1:123456789012:t"}},
	  {"match":{"namespace":"b","topic":"*"},"target":{"type":"sns","topic_arn":"arn:aws:sns:eu-west-1:123456789012:t"}}]}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := table.Routes[0]
	if r.MaxPayloadBytes != 5242880 || r.Target.Offload != (Offload{Bucket: "b-1", ThresholdBytes: 1000}) {
		t.Errorf("max %d, offload %+v", r.MaxPayloadBytes, r.Target.Offload)
	}
	if r.Target.Key() == table.Routes[1].Target.Key() || !strings.Contains(r.Target.Key(), `"offload":{"bucket":"b-1"`) {
		t.Errorf("keys %s and %s", r.Target.Key(), table.Routes[1].Target.Key())
	}
}

// The format is part of the target's key, so routes to one target in
// different formats get separate publishers; an unknown format is refused
// naming the route and the value allowed.
func TestFormatKeysTheTarget(t *testing.T) {
	t.Parallel()
	table, err := Parse([]byte(config(
		`{"match":{"namespace":"a","topic":"*"},"format":"cloudevents","cloudevents":{"source":"urn:x:{namespace}"},"target":`+httpTarget+`}`,
		`{"match":{"namespace":"b","topic":"*"},"format":"cloudevents","target":`+httpTarget+`}`,
		`{"match":{"namespace":"c","topic":"*"},"target":`+httpTarget+`}`)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := table.Routes[0].Target, table.Routes[1].Target, table.Routes[2].Target
	if a.Format != FormatCloudEvents || a.CloudEventsSource != "urn:x:{namespace}" || b.Format != FormatCloudEvents || b.CloudEventsSource != "" || c.Format != "" {
		t.Errorf("formats %+v / %+v / %+v", a, b, c)
	}
	if a.Key() == b.Key() || b.Key() == c.Key() || !strings.Contains(b.Key(), `"format":"cloudevents"`) {
		t.Errorf("keys %s, %s and %s", a.Key(), b.Key(), c.Key())
	}
	_, err = Parse([]byte(config(routeTo(snsTarget), `{"name": "ledger", "match": {"namespace": "l", "topic": "*"}, "format": "CloudEvents", "target": `+lambdaTarget+`}`)), Options{})
	if err == nil || !strings.Contains(err.Error(), `routes[1].format: must be "cloudevents"`) {
		t.Errorf("an unknown format: %v, want a problem at routes[1].format naming the value allowed", err)
	}
}
