package route

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// precedenceTable has a route at every precedence level, for namespace
// "payments" and topic "refund", plus bystanders.
var precedenceTable = config(
	`{"name": "any", "match": {"namespace": "*", "topic": "*"}, "target": `+ebTarget+`}`,
	`{"name": "refund-anywhere", "match": {"namespace": "*", "topic": "refund"}, "target": `+lambdaTarget+`}`,
	`{"name": "payments", "match": {"namespace": "payments", "topic": "*"}, "target": `+fifoTarget+`}`,
	`{"name": "payments-refund", "match": {"namespace": "payments", "topic": "refund"}, "target": `+httpTarget+`}`,
	`{"name": "billing-usage", "match": {"namespace": "billing", "topic": "usage"}, "target": `+snsTarget+`}`,
)

func TestMatchPrecedence(t *testing.T) {
	t.Parallel()
	table, err := Parse([]byte(precedenceTable), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ namespace, topic, want string }{
		{"payments", "refund", "payments-refund"}, // exact + exact
		{"payments", "charge", "payments"},        // exact + *
		{"audit", "refund", "refund-anywhere"},    // * + exact
		{"audit", "login", "any"},                 // * + *
		{"billing", "usage", "billing-usage"},
		{"billing", "refund", "refund-anywhere"}, // billing has no namespace route
		{"billing", "invoice", "any"},
		{"Payments", "refund", "refund-anywhere"}, // names are case-sensitive
	} {
		if got := table.Match(tc.namespace, tc.topic); got == nil || got.Name != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %s", tc.namespace, tc.topic, got, tc.want)
		}
	}
}

// The namespace outranks the topic whatever the configuration order.
func TestMatchNamespaceOutranksTopicInAnyOrder(t *testing.T) {
	t.Parallel()
	byNamespace := `{"name": "ns", "match": {"namespace": "payments", "topic": "*"}, "target": ` + snsTarget + `}`
	byTopic := `{"name": "topic", "match": {"namespace": "*", "topic": "refund"}, "target": ` + snsTarget + `}`
	for _, data := range []string{config(byNamespace, byTopic), config(byTopic, byNamespace)} {
		table, err := Parse([]byte(data), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := table.Match("payments", "refund"); got == nil || got.Name != "ns" {
			t.Errorf("Match = %v, want the namespace route", got)
		}
	}
}

func TestMatchNoRoute(t *testing.T) {
	t.Parallel()
	table, err := Parse([]byte(config(
		`{"match": {"namespace": "payments", "topic": "*"}, "target": `+snsTarget+`}`,
		`{"match": {"namespace": "*", "topic": "refund"}, "target": `+snsTarget+`}`,
		`{"match": {"namespace": "billing", "topic": "usage"}, "target": `+snsTarget+`}`,
	)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range [][2]string{{"billing", "invoice"}, {"audit", "login"}, {"", ""}, {"*", "*"}, {"usage", "billing"}} {
		if got := table.Match(m[0], m[1]); got != nil {
			t.Errorf("Match(%q, %q) = %s, want no route", m[0], m[1], got.Name)
		}
	}
	if got := table.Match("billing", "refund"); got == nil || got.Index != 1 {
		t.Errorf("Match(billing, refund) = %v, want routes[1]", got)
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	table, err := Parse([]byte(precedenceTable), Options{})
	if err != nil {
		t.Fatal(err)
	}
	namespace, topic := strings.Clone("payments"), strings.Clone("charge")
	if n := testing.AllocsPerRun(1000, func() { table.Match(namespace, topic) }); n != 0 {
		t.Errorf("Match allocates %v times per call", n)
	}
	if n := testing.AllocsPerRun(1000, func() { table.Routes[0].Target.Key() }); n != 0 {
		t.Errorf("Key of a parsed target allocates %v times per call", n)
	}
}

func BenchmarkMatch(b *testing.B) {
	var routes []string
	for i := range 200 {
		routes = append(routes, fmt.Sprintf(`{"match": {"namespace": "ns%d", "topic": "t%d"}, "target": %s}`, i%20, i, snsTarget))
	}
	routes = append(routes, `{"match": {"namespace": "*", "topic": "*"}, "target": `+snsTarget+`}`)
	table, err := Parse([]byte(config(routes...)), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if table.Match("ns3", "t123") == nil {
			b.Fatal("no route")
		}
	}
}

func TestMatchMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		m                Match
		namespace, topic string
		want             bool
	}{
		{Match{"a", "b"}, "a", "b", true},
		{Match{"a", "b"}, "a", "c", false},
		{Match{"a", "*"}, "a", "anything", true},
		{Match{"*", "b"}, "x", "b", true},
		{Match{"*", "b"}, "x", "c", false},
		{Match{"*", "*"}, "x", "y", true},
	} {
		if got := tc.m.Matches(tc.namespace, tc.topic); got != tc.want {
			t.Errorf("%s.Matches(%q, %q) = %v", tc.m, tc.namespace, tc.topic, got)
		}
	}
}

func TestTargetKey(t *testing.T) {
	t.Parallel()
	table, err := Parse([]byte(config(
		`{"match": {"namespace": "a", "topic": "*"}, "target": `+httpTarget+`}`,
		`{"match": {"namespace": "b", "topic": "*"}, "target": `+httpTarget+`}`,
		`{"match": {"namespace": "c", "topic": "*"}, "target": {"type": "http", "url": "https://billing.internal/usage", "signing_secret_env": "OTHER_SECRET"}}`,
		`{"match": {"namespace": "d", "topic": "*"}, "target": {"type": "http", "url": "https://billing.internal/usage", "signing_secret_env": "BILLING_SECRET", "timeout": "3s"}}`,
		`{"match": {"namespace": "e", "topic": "*"}, "target": {"type": "http", "url": "https://billing.internal/usage", "signing_secret_env": "BILLING_SECRET", "headers": {"X-Team": "b"}}}`,
		`{"match": {"namespace": "f", "topic": "*"}, "target": `+httpTarget+`, "max_payload_bytes": 1000}`,
		`{"match": {"namespace": "g", "topic": "*"}, "target": `+httpTarget+`, "retry": {"max_attempts": 3}, "schema": true, "name": "g"}`,
	)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := func(i int) string { return table.Routes[i].Target.Key() }
	if key(0) != key(1) {
		t.Errorf("equal targets have different keys:\n%s\n%s", key(0), key(1))
	}
	if key(0) != key(6) {
		t.Errorf("retry, schema and name changed the target key: %s", key(6))
	}
	for i := 2; i <= 5; i++ {
		if key(i) == key(0) {
			t.Errorf("routes[%d]'s target differs from routes[0]'s but has the same key %s", i, key(i))
		}
	}
	if got := len(table.Targets()); got != 5 {
		t.Errorf("Targets() has %d targets, want 5", got)
	}
	if first := table.Targets()[0]; first.Key() != key(0) {
		t.Errorf("Targets()[0] is %s, want routes[0]'s", first.Key())
	}

	// A hand-built target computes the same key as a parsed one.
	parsed := table.Routes[0].Target
	hand := Target{Type: "http", URL: "https://billing.internal/usage", SigningSecretEnv: "BILLING_SECRET",
		Timeout: 10 * time.Second, MaxPayloadBytes: 1048576, Concurrency: 8}
	if hand.Key() != parsed.Key() {
		t.Errorf("hand-built key %s, parsed %s", hand.Key(), parsed.Key())
	}
	// Separators inside values cannot make two targets collide.
	a := Target{Type: "http", URL: `https://h/x","signing_secret_env":"S`}
	b := Target{Type: "http", URL: `https://h/x`, SigningSecretEnv: "S"}
	if a.Key() == b.Key() {
		t.Errorf("distinct targets collide on %s", a.Key())
	}
}

func TestTargetIsFIFO(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		target Target
		want   bool
	}{
		{Target{Type: "sns", TopicARN: "arn:aws:sns:eu-west-1:123456789012:payments.fifo"}, true},
		{Target{Type: "sns", TopicARN: "arn:aws:sns:eu-west-1:123456789012:payments"}, false},
		{Target{Type: "sns", TopicARN: "arn:aws:sns:eu-west-1:123456789012:fifo"}, false},
		{Target{Type: "eventbridge", EventBus: "orders.fifo"}, false},
		{Target{Type: "http", URL: "https://h/x.fifo"}, false},
	} {
		if got := tc.target.IsFIFO(); got != tc.want {
			t.Errorf("%+v.IsFIFO() = %v, want %v", tc.target, got, tc.want)
		}
	}
}

func TestExpandTemplate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ template, want string }{
		{"outbox.{namespace}", "outbox.payments"},
		{"{topic}", "refund"},
		{"{namespace}.{topic}.{namespace}", "payments.refund.payments"},
		{"static", "static"},
		{"{other}{topic", "{other}{topic"},
		{"", ""},
	} {
		if got := ExpandTemplate(tc.template, "payments", "refund"); got != tc.want {
			t.Errorf("ExpandTemplate(%q) = %q, want %q", tc.template, got, tc.want)
		}
	}
}
