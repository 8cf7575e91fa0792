// Package publishers builds, once per cold start, one publisher for each
// distinct target in the route table: the AWS clients, HTTP connection pools
// and signing secrets it needs are set up here and reused by every
// invocation. A target that cannot be built (a missing secret, say) fails
// the cold start with a message naming its route.
package publishers

import (
	"context"
	"fmt"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sns"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/awserr"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
	ebpub "github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/publish/lambdainvoke"
	"github.com/outboxkit/dispatcher/shared/publish/offload"
	snspub "github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/route"
)

// Deps are what building publishers needs from the outside world.
type Deps struct {
	// AWS is the SDK configuration (region, credentials, endpoints); tracing
	// instrumentation, when on, is already installed in its APIOptions.
	AWS aws.Config
	// SigningSecret returns the value of the variable a route's
	// signing_secret_env names ("" when unset); the config package read
	// them with the routes.
	SigningSecret func(variable string) string
	// WrapHTTP, when set, wraps each plugin HTTP client (tracing).
	WrapHTTP func(*http.Client) *http.Client
}

// inlineBytes is what each target type takes inline by default (the
// routes schema's max_payload_bytes defaults): with offload, the most a
// route's publisher sends, and the largest threshold.
var inlineBytes = map[string]int{route.TypeSNS: 256 << 10, route.TypeEventBridge: 256 << 10, route.TypeHTTP: 1 << 20, route.TypeLambda: 1 << 20}

func ptr[T any](v T) *T { return &v }

// Build returns a publisher per distinct target of table, keyed by
// route.Target.Key().
func Build(ctx context.Context, table *route.Table, deps Deps) (map[string]publish.Publisher, error) {
	awsCfg := deps.AWS.Copy()
	// Short SDK retries without a retry quota (see awserr.NewRetryer): the
	// outbox retries with its own backoff, and an invocation's deadline is
	// better spent on other messages than on one throttled call.
	awsCfg.Retryer = awserr.NewRetryer
	// One HTTP client for the AWS SDK clients (awsHTTPClient): a pool for
	// every call in flight, each request in one write.
	inFlight := 0
	for _, r := range table.Routes {
		inFlight = max(inFlight, r.Target.Concurrency)
	}
	awsCfg.HTTPClient = awsHTTPClient(inFlight)

	var (
		snsClient *sns.Client
		ebClient  *eventbridge.Client
		lmClient  *lambda.Client
		smClient  *secretsmanager.Client
		s3Client  *s3.Client
	)
	out := map[string]publish.Publisher{}
	for _, r := range table.Routes {
		key := r.Target.Key()
		if out[key] != nil {
			continue
		}
		t := r.Target
		var (
			p   publish.Publisher
			err error
		)
		// With offload, the route may take payloads larger than its target:
		// the target's publisher is built with what the target takes inline.
		oc, offloads, err := offload.FromRoute(t, inlineBytes[t.Type])
		if err != nil {
			return nil, fmt.Errorf("target: %s (%s): %w", r.Name, t.Type, err)
		}
		var events *cloudevent.Encoder
		if t.Format == route.FormatCloudEvents {
			if events, err = cloudevent.New(t.CloudEventsSource); err != nil {
				return nil, fmt.Errorf("target: %s (%s): cloudevents.%w", r.Name, t.Type, err)
			}
		}
		if offloads {
			r = ptr(*r)
			r.MaxPayloadBytes = min(r.MaxPayloadBytes, inlineBytes[t.Type])
		}
		switch t.Type {
		case "sns":
			if snsClient == nil {
				// The publisher's own client: its PublishBatch serializer
				// (a hot key pays the SDK's on every call), a retryer
				// without a retry quota, a pool for every call in flight.
				snsClient = snspub.NewClient(awsCfg, inFlight)
			}
			p, err = snspub.New(snsClient, snspub.Config{
				TopicARN: t.TopicARN, DefaultGroupID: t.MessageGroupID, MaxMessageBytes: r.MaxPayloadBytes,
				Timeout: r.Timeout, Concurrency: t.Concurrency, CloudEvents: events,
			})
		case "eventbridge":
			if ebClient == nil {
				ebClient = ebpub.NewClient(awsCfg)
			}
			p, err = ebpub.New(ebClient, ebpub.Config{
				EventBus: t.EventBus, Source: t.Source, DetailType: t.DetailType, MaxEntryBytes: r.MaxPayloadBytes,
				Timeout: r.Timeout, Concurrency: t.Concurrency, CloudEvents: events,
			})
		case "lambda":
			if lmClient == nil {
				lmClient = lambda.NewFromConfig(awsCfg)
			}
			p, err = lambdainvoke.New(lmClient, lambdainvoke.Config{
				Function: t.Function, Timeout: r.Timeout, MaxPayloadBytes: r.MaxPayloadBytes, Concurrency: t.Concurrency, CloudEvents: events,
			})
		case "http":
			if t.SigningSecretARN != "" && smClient == nil {
				smClient = secretsmanager.NewFromConfig(awsCfg)
			}
			var secret []byte
			secret, err = webhook.ResolveSecret(ctx, webhook.SecretRef{Env: t.SigningSecretEnv, ARN: t.SigningSecretARN}, deps.SigningSecret, smClient)
			if err == nil {
				client := webhook.NewHTTPClient(t.Concurrency)
				if deps.WrapHTTP != nil {
					client = deps.WrapHTTP(client)
				}
				p, err = webhook.New(client, webhook.Config{
					URL: t.URL, Secret: secret, Timeout: r.Timeout, MaxPayloadBytes: r.MaxPayloadBytes,
					Headers: t.Headers, Concurrency: t.Concurrency, CloudEvents: events,
				})
			}
		default:
			err = fmt.Errorf("unknown target type %q", t.Type)
		}
		if offloads && err == nil {
			if s3Client == nil {
				s3Client = s3.NewFromConfig(awsCfg)
			}
			p, err = offload.New(p, s3Client, oc)
		}
		if err != nil {
			return nil, fmt.Errorf("target: %s (%s): %w", r.Name, t.Type, err)
		}
		out[key] = p
	}
	return out, nil
}
