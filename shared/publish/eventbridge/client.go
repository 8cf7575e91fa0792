package eventbridge

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
)

// NewClient builds the EventBridge client a Publisher should be given, from
// the function's AWS configuration (config.LoadDefaultConfig, so
// AWS_ENDPOINT_URL_EVENTBRIDGE and the rest still apply): the SDK's client
// with PutEvents' body written by this package (putEventsProtocol): the
// same request for less CPU per message. optFns apply after, as in
// eventbridge.NewFromConfig.
func NewClient(awsCfg aws.Config, optFns ...func(*eventbridge.Options)) *eventbridge.Client {
	return eventbridge.NewFromConfig(awsCfg, append([]func(*eventbridge.Options){withPutEventsCodec}, optFns...)...)
}

// withPutEventsCodec wraps the client's protocol in putEventsProtocol.
func withPutEventsCodec(o *eventbridge.Options) {
	o.Protocol = putEventsProtocol{ClientProtocol: o.Protocol}
}
