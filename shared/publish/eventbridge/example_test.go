package eventbridge_test

import (
	"context"
	"log"
	"net/http"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"

	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
)

// A publisher built once per cold start: a client with few SDK attempts
// (the outbox retries durably) and enough idle connections for the
// publisher's concurrency.
func ExampleNew() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRetryMaxAttempts(2))
	if err != nil {
		log.Fatal(err)
	}
	client := awseb.NewFromConfig(cfg, func(o *awseb.Options) {
		o.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.MaxIdleConnsPerHost = 16 // at least Config.Concurrency
		})
	})
	publisher, err := eventbridge.New(client, eventbridge.Config{
		EventBus:   "arn:aws:events:eu-west-1:123456789012:event-bus/billing",
		Source:     "outbox.{namespace}",
		DetailType: "{topic}",
		// This account's PutEvents cap was raised to 1 MiB.
		MaxEntryBytes: eventbridge.MaxEntryBytesLimit,
	})
	if err != nil {
		log.Fatal(err) // names the Config field at fault
	}
	_ = publisher // publisher.Publish(ctx, claimed) once per claimed batch
}
