package publishers_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/publish/lambdainvoke"
	"github.com/outboxkit/dispatcher/shared/publish/publishers"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/route"
)

var awsCfg = aws.Config{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("k", "s", "")}

func env(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }

func TestOnePublisherPerDistinctTarget(t *testing.T) {
	t.Parallel()
	table, err := route.Parse([]byte(`{"routes":[
	  {"match":{"namespace":"billing","topic":"*"},"target":{"type":"http","url":"https://billing.example/usage","signing_secret_env":"SECRET"}},
	  {"match":{"namespace":"billing","topic":"refund"},"target":{"type":"http","url":"https://billing.example/usage","signing_secret_env":"SECRET"}},
	  {"match":{"namespace":"payments","topic":"*"},"target":{"type":"sns","topic_arn":"arn:aws:sns:eu-west-1:123456789012:payments.fifo"}},
	  {"match":{"namespace":"*","topic":"*"},"target":{"type":"eventbridge","event_bus":"default"}},
	  {"match":{"namespace":"audit","topic":"*"},"target":{"type":"lambda","function":"audit-sink","concurrency":16}}]}`), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pubs, err := publishers.Build(context.Background(), table, publishers.Deps{AWS: awsCfg, SigningSecret: env(map[string]string{"SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})})
	if err != nil {
		t.Fatal(err)
	}
	if len(pubs) != 4 {
		t.Fatalf("%d publishers for 4 distinct targets", len(pubs))
	}
	if pubs[table.Routes[0].Target.Key()] != pubs[table.Routes[1].Target.Key()] {
		t.Error("two routes to the same target got two publishers")
	}
	for i, want := range []string{"webhook", "webhook", "sns", "eventbridge", "lambdainvoke"} {
		var ok bool
		switch p := pubs[table.Routes[i].Target.Key()]; want {
		case "webhook":
			_, ok = p.(*webhook.Publisher)
		case "sns":
			_, ok = p.(*sns.Publisher)
		case "eventbridge":
			_, ok = p.(*eventbridge.Publisher)
		case "lambdainvoke":
			_, ok = p.(*lambdainvoke.Publisher)
		}
		if !ok {
			t.Errorf("route %d: publisher %T, want %s", i, pubs[table.Routes[i].Target.Key()], want)
		}
	}
}

func TestAMissingSecretFailsTheColdStartNamingTheRoute(t *testing.T) {
	t.Parallel()
	table, err := route.Parse([]byte(`{"routes":[{"name":"usage","match":{"namespace":"*","topic":"*"},
	  "target":{"type":"http","url":"https://billing.example/usage","signing_secret_env":"UNSET_SECRET"}}]}`), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = publishers.Build(context.Background(), table, publishers.Deps{AWS: awsCfg, SigningSecret: env(nil)})
	if err == nil || !strings.Contains(err.Error(), "usage") || !strings.Contains(err.Error(), "UNSET_SECRET") {
		t.Fatalf("err = %v, want it to name the route and the variable", err)
	}
}
