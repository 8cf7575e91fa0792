package sns

import (
	"net/http"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sns"

	"github.com/outboxkit/dispatcher/shared/publish/awserr"
)

// The SDK retryer NewClient installs: awserr.NewRetryer's, the same for
// every AWS publisher's client.
const (
	// ClientMaxAttempts is the SDK's attempts per PublishBatch call, the
	// first included.
	ClientMaxAttempts = awserr.RetryMaxAttempts
	// ClientMaxBackoff caps the SDK's jittered wait before its retry.
	ClientMaxBackoff = awserr.RetryMaxBackoff
)

// NewClient builds the SNS client a Publisher should be given, from the
// function's AWS configuration (config.LoadDefaultConfig, so the
// AWS_ENDPOINT_URL_SNS convention still applies):
//
//   - a retryer of ClientMaxAttempts attempts, jittered waits below
//     ClientMaxBackoff and no retry quota: the outbox retries with backoff
//     across invocations, and a retry quota drained by one bad minute would
//     otherwise fail fast calls that would have succeeded;
//   - a PublishBatch serializer of this package's in place of the SDK's:
//     the same request, byte for byte, for a fraction of the CPU (see
//     publishBatchSerializer), which a hot ordering key pays on every call;
//     and a deserializer that reads SNS's plain answers into the output
//     the SDK's builds, without encoding/xml (publishBatchDeserializer);
//   - an HTTP connection pool that keeps at least maxInFlight idle
//     connections per host, maxInFlight being the PublishBatch calls the
//     function can have in flight at once (Config.Concurrency times the
//     Publish calls it runs in parallel). With fewer, every call beyond
//     the pool's size opens a new connection (and a TLS handshake) and
//     the throughput falls well short of Concurrency calls per round trip.
//     The SDK's default keeps 10; net/http's DefaultTransport only 2.
//
// The pool is sized only when awsCfg.HTTPClient is nil or the SDK's own
// *awshttp.BuildableClient; a client of another type is used as it is, and
// sizing its pool is the caller's business. optFns apply last, after these
// settings. AWS_MAX_ATTEMPTS / aws.Config.RetryMaxAttempts, when set, still
// override the attempt count, as everywhere in the SDK.
func NewClient(awsCfg aws.Config, maxInFlight int, optFns ...func(*sns.Options)) *sns.Client {
	configure := func(o *sns.Options) {
		o.Retryer = awserr.NewRetryer()
		if buildable, ok := o.HTTPClient.(*awshttp.BuildableClient); ok {
			o.HTTPClient = withIdleConnections(buildable, maxInFlight)
		}
		// Clipped, so that appending never writes into a slice the
		// configuration shares with other clients.
		o.APIOptions = append(slices.Clip(o.APIOptions), swapPublishBatchSerializer, swapPublishBatchDeserializer)
	}
	return sns.NewFromConfig(awsCfg, append([]func(*sns.Options){configure}, optFns...)...)
}

func withIdleConnections(c *awshttp.BuildableClient, perHost int) *awshttp.BuildableClient {
	return c.WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConnsPerHost = max(t.MaxIdleConnsPerHost, perHost)
		if t.MaxIdleConns != 0 {
			t.MaxIdleConns = max(t.MaxIdleConns, perHost)
		}
	})
}
