package route_test

import (
	"fmt"

	"github.com/outboxkit/dispatcher/shared/route"
)

// A routes file with one route of each target type, in YAML; the same in
// JSON is {"routes": [{"name": "billing-usage", "match": {...}, ...}, ...]}.
func ExampleParse() {
	table, err := route.Parse([]byte(`
routes:
  - name: billing-usage
    match: {namespace: mini-chat, topic: usage_snapshot}
    target:
      type: http
      url: https://billing.internal/usage
      signing_secret_env: BILLING_WEBHOOK_SECRET
      timeout: 5s
    retry: {max_attempts: 12, base_delay: 1s, max_delay: 15m}
    max_payload_bytes: 65536
    schema:
      type: object
      required: [tenant_id]
  - match: {namespace: payments, topic: "*"}
    target:
      type: sns
      topic_arn: arn:aws:sns:eu-west-1:123456789012:payments.fifo
      message_group_id: payments
  - match: {namespace: "*", topic: "*"}
    target:
      type: eventbridge
      event_bus: default
      source: outbox.{namespace}
      detail_type: "{topic}"
  - match: {namespace: audit, topic: "*"}
    target:
      type: lambda
      function: arn:aws:lambda:eu-west-1:123456789012:function:audit-sink
`), route.Options{})
	if err != nil {
		fmt.Println(err) // a *route.ConfigError listing every problem
		return
	}
	for _, m := range []route.Match{{"mini-chat", "usage_snapshot"}, {"payments", "refund"}, {"audit", "login"}, {"crm", "signup"}} {
		r := table.Match(m.Namespace, m.Topic)
		fmt.Printf("%s → %s (%s, timeout %s)\n", m, r.Name, r.Target.Type, r.Timeout)
	}
	// Output:
	// mini-chat/usage_snapshot → billing-usage (http, timeout 5s)
	// payments/refund → routes[1] (sns, timeout 10s)
	// audit/login → routes[3] (lambda, timeout 10s)
	// crm/signup → routes[2] (eventbridge, timeout 10s)
}

// Every problem of a configuration, at its field path.
func ExampleConfigError() {
	_, err := route.Parse([]byte(`{"routes": [
	  {"match": {"namespace": "payments", "topic": "*"},
	   "target": {"type": "sns", "topic_arn": "arn:aws:sns:eu-west-1:1234:payments", "tiemout": "5s"}},
	  {"match": {"namespace": "payments", "topic": "*"},
	   "target": {"type": "http", "url": "http://billing.internal/usage", "signing_secret_env": "BILLING_SECRET"},
	   "retry": {"base_delay": "1h"}}
	]}`), route.Options{})
	fmt.Println(err)
	// Output:
	// route: invalid configuration (5 problems):
	// routes[0].target.tiemout: unknown field "tiemout" (did you mean "timeout"?); the fields of an sns target are type, timeout, concurrency, topic_arn, message_group_id
	// routes[0].target.topic_arn: must have a 12-digit account id; got "arn:aws:sns:eu-west-1:1234:payments"
	// routes[1].match: namespace "payments" and topic "*" are already matched by routes[0]; each pair of patterns may appear once
	// routes[1].retry.max_delay: is 15m (the default), less than base_delay 1h; max_delay must be at least base_delay
	// routes[1].target.url: uses http:// to billing.internal, which sends messages unencrypted; use https://, or set allow_insecure_http: true on a network you trust
}
