package publishers_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/publish/lambdainvoke"
	"github.com/outboxkit/dispatcher/shared/publish/offload"
	"github.com/outboxkit/dispatcher/shared/publish/publishers"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
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

// The dispatch function's AWS clients retry each failed call once, however
// many failed before it. A client with the SDK's retry quota stops retrying
// after about 100 failures in a row (its quota of 500 tokens, 5 a retry),
// so that in one bad minute calls that would have succeeded on their retry
// fail fast.
func TestAWSClientsRetryEveryFailedCallOnceWithoutAQuota(t *testing.T) {
	t.Parallel()
	const calls = 150
	type fake interface {
		Config() aws.Config
		Requests() int
	}
	for _, tc := range []struct {
		name    string
		target  func(t *testing.T) (fake, string) // the fake, failing every call, and the route's target
		perCall int
	}{
		{"sns", func(t *testing.T) (fake, string) {
			f := snsfake.New(t)
			f.FailCalls(10*calls, http.StatusInternalServerError, "InternalError")
			return f, fmt.Sprintf(`{"type":"sns","topic_arn":%q,"concurrency":64}`, snsfake.TopicARN("storm"))
		}, 10},
		{"eventbridge", func(t *testing.T) (fake, string) {
			f := eventbridgefake.New(t)
			f.FailCalls(10*calls, http.StatusInternalServerError, "InternalException")
			return f, `{"type":"eventbridge","event_bus":"default","concurrency":64}`
		}, 10},
		{"lambda", func(t *testing.T) (fake, string) {
			f := lambdafake.New(t)
			f.FailCalls(10*calls, http.StatusInternalServerError, "ServiceException")
			return f, `{"type":"lambda","function":"sink","concurrency":64}`
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, target := tc.target(t)
			table, err := route.Parse([]byte(`{"routes":[{"match":{"namespace":"*","topic":"*"},"target":`+target+`}]}`), route.Options{})
			if err != nil {
				t.Fatal(err)
			}
			cfg := f.Config()
			cfg.RetryMaxAttempts = 0 // a fake may turn the SDK's retries off; the function's configuration does not
			pubs, err := publishers.Build(context.Background(), table, publishers.Deps{AWS: cfg})
			if err != nil {
				t.Fatal(err)
			}
			results := pubs[table.Routes[0].Target.Key()].Publish(context.Background(), publishtest.Messages(tc.perCall*calls, 64))
			for _, r := range results {
				if r.Kind == publish.Delivered {
					t.Fatalf("a message was delivered by a call that failed: %+v", r)
				}
			}
			if got := f.Requests(); got != 2*calls {
				t.Fatalf("%d requests for %d failing calls: want each call retried exactly once (%d)", got, calls, 2*calls)
			}
		})
	}
}

// A route with offload gets its target's publisher wrapped, built with
// what the target takes inline although the route's max_payload_bytes is
// larger; a threshold over that fails the cold start naming the route.
func TestOffloadWrapsTheTargetsPublisher(t *testing.T) {
	t.Parallel()
	table, err := route.Parse([]byte(`{"routes":[
	  {"match":{"namespace":"billing","topic":"*"},"max_payload_bytes":4194304,"offload":{"bucket":"acme-payloads"},
	   "target":{"type":"sns","topic_arn":"arn:aws:sns:eu-west-1:123456789012:invoices"}},
	  {"match":{"namespace":"audit","topic":"*"},"target":{"type":"sns","topic_arn":"arn:aws:sns:eu-west-1:123456789012:invoices"}}]}`), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pubs, err := publishers.Build(context.Background(), table, publishers.Deps{AWS: awsCfg})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pubs[table.Routes[0].Target.Key()].(*offload.Publisher); !ok {
		t.Errorf("the offloading route's publisher is %T", pubs[table.Routes[0].Target.Key()])
	}
	if _, ok := pubs[table.Routes[1].Target.Key()].(*sns.Publisher); !ok {
		t.Errorf("the other route's publisher is %T", pubs[table.Routes[1].Target.Key()])
	}

	table, err = route.Parse([]byte(`{"routes":[{"name":"invoices","match":{"namespace":"*","topic":"*"},
	  "offload":{"bucket":"acme-payloads","threshold_bytes":300000},
	  "target":{"type":"eventbridge","event_bus":"default"}}]}`), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = publishers.Build(context.Background(), table, publishers.Deps{AWS: awsCfg})
	if err == nil || !strings.Contains(err.Error(), "invoices") || !strings.Contains(err.Error(), "threshold_bytes") {
		t.Fatalf("err = %v, want it to name the route and threshold_bytes", err)
	}
}
