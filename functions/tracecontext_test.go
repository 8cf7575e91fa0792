package functions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// A producer traced with OpenTelemetry passes its trace context as the
// headers traceparent and tracestate; the real dispatch bootstrap carries
// it to every target type, where an OpenTelemetry consumer reads the
// producer's trace back: a webhook's request headers (beside the X-Ray
// header of the same trace), a Lambda function's envelope, SNS message
// attributes (moto, through SQS), and EventBridge, whose entry has only
// X-Ray's TraceHeader (of the same trace) and whose CloudEvents detail
// carries the Distributed Tracing extension.
func TestDispatchCarriesTheProducersTraceContextToEveryTarget(t *testing.T) {
	t.Parallel()
	const (
		traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
		parentID    = "00f067aa0ba902b7"
		traceParent = "00-" + traceID + "-" + parentID + "-01"
		traceState  = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
		xray        = "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=" + parentID + ";Sampled=1"
	)
	ctx := context.Background()
	srv := moto.Start(t, "trace context to SNS")
	sqsc, snsc := sqs.NewFromConfig(srv.Config()), awssns.NewFromConfig(srv.Config())
	name := "tc-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	queue, err := sqsc.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	queueAttrs, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: queue.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	topic, err := snsc.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snsc.Subscribe(ctx, &awssns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"),
		Endpoint:   aws.String(queueAttrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]),
		Attributes: map[string]string{"RawMessageDelivery": "true"}}); err != nil {
		t.Fatal(err)
	}

	var (
		mu       sync.Mutex
		requests []http.Header
		invoked  [][]byte
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		requests = append(requests, req.Header.Clone())
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()
	functions := lambdafake.New(t)
	functions.Handle("ledger-sink", func(payload []byte) (int, []byte, string) {
		mu.Lock()
		invoked = append(invoked, payload)
		mu.Unlock()
		return http.StatusOK, []byte(`{}`), ""
	})
	bus := eventbridgefake.New(t)

	db := pgtest.New(t)
	namespaces := []string{"hooks", "ledger", "notify", "events", "cloudevents"}
	var msgs []outbox.Message
	for _, ns := range namespaces {
		msgs = append(msgs, outbox.Message{Namespace: ns, Topic: "invoice.paid", Payload: json.RawMessage(`{"invoice":"inv-1"}`),
			Headers: map[string]string{"traceparent": traceParent, "tracestate": traceState}})
	}
	if _, err := outbox.EnqueueBatch(ctx, db.Pool, msgs); err != nil {
		t.Fatal(err)
	}
	routes := fmt.Sprintf(`{"routes":[
	  {"match":{"namespace":"hooks","topic":"*"},"target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET","timeout":"30s"}},
	  {"match":{"namespace":"ledger","topic":"*"},"target":{"type":"lambda","function":"ledger-sink","timeout":"30s"}},
	  {"match":{"namespace":"notify","topic":"*"},"target":{"type":"sns","topic_arn":%q,"timeout":"30s"}},
	  {"match":{"namespace":"events","topic":"*"},"target":{"type":"eventbridge","event_bus":"default","timeout":"30s"}},
	  {"match":{"namespace":"cloudevents","topic":"*"},"format":"cloudevents","target":{"type":"eventbridge","event_bus":"default","timeout":"30s"}}]}`,
		receiver.URL, aws.ToString(topic.TopicArn))
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+routes, "AWS_ENDPOINT_URL="+srv.URL,
		"AWS_ENDPOINT_URL_LAMBDA="+functions.URL(), "AWS_ENDPOINT_URL_EVENTBRIDGE="+bus.URL())...)
	dispatchAll(t, fn, func(s *dispatch.Summary) { invoke(t, fn, event(t, "dispatch-schedule.json"), 50*time.Second, s) }, len(msgs))

	readsAsTheProducersTrace := func(target string, carrier propagation.TextMapCarrier) {
		t.Helper()
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, carrier))
		if sc.TraceID().String() != traceID || sc.SpanID().String() != parentID || !sc.IsSampled() || sc.TraceState().String() != traceState {
			t.Errorf("%s: OpenTelemetry reads trace %s parent %s sampled %v state %q, want the producer's %s",
				target, sc.TraceID(), sc.SpanID(), sc.IsSampled(), sc.TraceState(), traceParent)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	if len(requests) != 1 || len(invoked) != 1 {
		t.Fatalf("%d webhook requests and %d invocations, want 1 each", len(requests), len(invoked))
	}
	readsAsTheProducersTrace("webhook", propagation.HeaderCarrier(requests[0]))
	if got := requests[0].Get("X-Amzn-Trace-Id"); got != xray {
		t.Errorf("webhook: X-Amzn-Trace-Id %q, want the same trace for X-Ray %q", got, xray)
	}
	var envelope publish.Envelope
	if err := json.Unmarshal(invoked[0], &envelope); err != nil {
		t.Fatal(err)
	}
	readsAsTheProducersTrace("lambda", propagation.MapCarrier(envelope.Headers))

	r, err := sqsc.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: queue.QueueUrl, WaitTimeSeconds: 5,
		MessageAttributeNames: []string{"All"}})
	if err != nil || len(r.Messages) != 1 {
		t.Fatalf("SNS subscriber got %d messages (%v), want 1", len(r.Messages), err)
	}
	attributes := propagation.MapCarrier{}
	for name, value := range r.Messages[0].MessageAttributes {
		attributes[name] = aws.ToString(value.StringValue)
	}
	readsAsTheProducersTrace("sns", attributes)
	if attributes["outbox.trace_header"] != xray {
		t.Errorf("sns: outbox.trace_header %q, want %q", attributes["outbox.trace_header"], xray)
	}

	entries := bus.Received()
	if len(entries) != 2 {
		t.Fatalf("EventBridge got %d entries, want 2", len(entries))
	}
	for _, e := range entries {
		if e.TraceHeader != xray {
			t.Errorf("eventbridge %s: TraceHeader %q, want the same trace for X-Ray %q", e.Source, e.TraceHeader, xray)
		}
		if e.Source == "outbox.cloudevents" {
			ev := publishtest.ReadStructuredCloudEvent(t, []byte(e.Detail))
			extensions := propagation.MapCarrier{}
			for name, value := range ev.Extensions() {
				extensions[name], _ = value.(string)
			}
			readsAsTheProducersTrace("eventbridge, format cloudevents", extensions)
		}
	}
}
