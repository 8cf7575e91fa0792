package functions_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/uuid"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// ceMessages enqueues, for each namespace, an ordered message with a dedupe
// key, a tenant and a producer header, and an unordered one with none, and
// returns them as the dispatcher claims them (the payload as jsonb writes
// it, the creation time, the sequence id), by stable key.
func ceMessages(t *testing.T, db *pgtest.DB, namespaces ...string) map[string]*outboxtype.Message {
	t.Helper()
	ctx := context.Background()
	var msgs []outbox.Message
	for _, ns := range namespaces {
		msgs = append(msgs,
			outbox.Message{Namespace: ns, Topic: "invoice.paid", DedupeKey: "inv-" + ns, TenantID: "acme", OrderingKey: "account-7",
				Headers: map[string]string{"X-Request-Id": "r-" + ns}, Payload: json.RawMessage(`{"invoice": "inv-` + ns + `", "amount": 9900, "lines": [1, 2]}`)},
			outbox.Message{Namespace: ns, Topic: "usage.recorded", Payload: json.RawMessage(`[{"meter": "api", "n": 3}]`)},
		)
	}
	if _, err := outbox.EnqueueBatch(ctx, db.Pool, msgs); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT id, namespace, topic, coalesce(tenant_id, ''), coalesce(dedupe_key, ''),
		coalesce(ordering_key, ''), coalesce(sequence_id, 0), payload::text, created_at FROM outbox.pending`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]*outboxtype.Message{}
	for rows.Next() {
		m := &outboxtype.Message{}
		var payload string
		if err := rows.Scan(&m.ID, &m.Namespace, &m.Topic, &m.TenantID, &m.DedupeKey, &m.OrderingKey, &m.SequenceID, &payload, &m.CreatedAt); err != nil {
			t.Fatal(err)
		}
		m.Payload = json.RawMessage(payload)
		out[m.StableKey()] = m
	}
	if err := rows.Err(); err != nil || len(out) != len(msgs) {
		t.Fatalf("%d messages pending (%v), want %d", len(out), err, len(msgs))
	}
	return out
}

// dispatchAll invokes the dispatch bootstrap until want messages are
// delivered, failing on any that is not.
func dispatchAll(t *testing.T, fn interface{ Stderr() string }, run func(*dispatch.Summary), want int) {
	t.Helper()
	var sum dispatch.Summary
	for i := 0; i < 5 && sum.Delivered < want; i++ {
		var one dispatch.Summary
		run(&one)
		if one.Dead != 0 || one.Retried != 0 {
			t.Fatalf("invocation %d: %+v\n%s", i, one, fn.Stderr())
		}
		sum.Delivered += one.Delivered
	}
	if sum.Delivered != want {
		t.Fatalf("delivered %d, want %d\n%s", sum.Delivered, want, fn.Stderr())
	}
}

// The dispatch function sends format cloudevents: a webhook receives each
// message in binary mode, which the CloudEvents SDK reads from the request
// and whose Standard Webhooks signature verifies, the payload unchanged as
// the body and the event's id the webhook-id; a Lambda function is invoked
// with the structured event.
func TestDispatchCloudEventsToWebhooksAndLambda(t *testing.T) {
	t.Parallel()
	verifier, err := standardwebhooks.NewWebhook(sinkSecret)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		received = map[string]*cloudevents.Event{}
		bodies   = map[string][]byte{}
		headers  = map[string]http.Header{}
		problems []string
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		ev, err := cehttp.NewEventFromHTTPRequest(req)
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			err = verifier.Verify(body, req.Header)
		}
		if err != nil {
			problems = append(problems, err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		received[ev.ID()], bodies[ev.ID()], headers[ev.ID()] = ev, body, req.Header.Clone()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	fake := lambdafake.New(t)
	var invoked [][]byte
	fake.Handle("ledger-sink", func(payload []byte) (int, []byte, string) {
		mu.Lock()
		defer mu.Unlock()
		invoked = append(invoked, bytes.Clone(payload))
		return http.StatusOK, []byte(`{}`), ""
	})

	db := pgtest.New(t)
	msgs := ceMessages(t, db, "billing", "ledger")
	routes := fmt.Sprintf(`{"routes":[
	  {"match":{"namespace":"billing","topic":"*"},"format":"cloudevents",
	   "target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET","timeout":"30s"}},
	  {"match":{"namespace":"ledger","topic":"*"},"format":"cloudevents","cloudevents":{"source":"urn:example:{namespace}:{topic}"},
	   "target":{"type":"lambda","function":"ledger-sink","timeout":"30s"}}]}`, receiver.URL)
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+routes, "AWS_ENDPOINT_URL_LAMBDA="+fake.URL())...)
	dispatchAll(t, fn, func(s *dispatch.Summary) { invoke(t, fn, event(t, "dispatch-schedule.json"), 50*time.Second, s) }, len(msgs))

	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the webhook receiver: %v", problems)
	}
	for key, m := range msgs {
		switch m.Namespace {
		case "billing":
			ev := received[key]
			if ev == nil {
				t.Errorf("the webhook got no event of id %q", key)
				continue
			}
			publishtest.CheckCloudEvent(t, ev, m, "/outbox/billing")
			if !bytes.Equal(bodies[key], m.Payload) {
				t.Errorf("body %s, want the payload unchanged %s", bodies[key], m.Payload)
			}
			if h := headers[key]; h.Get("Webhook-Id") != key || h.Get("Content-Type") != "application/json" {
				t.Errorf("webhook-id %q content-type %q, want %q and application/json", h.Get("Webhook-Id"), h.Get("Content-Type"), key)
			}
			if m.DedupeKey != "" && headers[key].Get("X-Request-Id") != "r-billing" {
				t.Errorf("the producer's header was not sent: %v", headers[key])
			}
		case "ledger":
			var found bool
			for _, payload := range invoked {
				if ev := publishtest.ReadStructuredCloudEvent(t, payload); ev.ID() == key {
					found = true
					publishtest.CheckCloudEvent(t, ev, m, "urn:example:ledger:"+m.Topic)
				}
			}
			if !found {
				t.Errorf("the function was not invoked with the event of id %q; invocations: %q", key, invoked)
			}
		}
	}
	if len(invoked) != 2 {
		t.Errorf("%d invocations, want 2", len(invoked))
	}
}

// The dispatch function sends format cloudevents to SNS and EventBridge
// (moto): an SQS subscriber of the topic gets the structured event as the
// message body, with the outbox's attributes as before; a rule's SQS target
// gets it as the event's detail, under the route's source and detail-type.
func TestDispatchCloudEventsToSNSAndEventBridge(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "format cloudevents to SNS and EventBridge")
	ctx := context.Background()
	cfg := srv.Config()
	snsc, sqsc, ebc := awssns.NewFromConfig(cfg), sqs.NewFromConfig(cfg), awseb.NewFromConfig(cfg)
	name := "ce-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	queue := func(suffix string) (url, arn string) {
		q, err := sqsc.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name + suffix)})
		if err != nil {
			t.Fatal(err)
		}
		a, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl,
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(q.QueueUrl), a.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]
	}
	snsQueue, snsQueueARN := queue("-sns")
	ebQueue, ebQueueARN := queue("-eb")
	topic, err := snsc.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snsc.Subscribe(ctx, &awssns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"),
		Endpoint: aws.String(snsQueueARN), Attributes: map[string]string{"RawMessageDelivery": "true"}}); err != nil {
		t.Fatal(err)
	}
	pattern, _ := json.Marshal(map[string][]string{"source": {"outbox.ledger"}})
	if _, err := ebc.PutRule(ctx, &awseb.PutRuleInput{Name: aws.String(name), EventPattern: aws.String(string(pattern))}); err != nil {
		t.Fatal(err)
	}
	if _, err := ebc.PutTargets(ctx, &awseb.PutTargetsInput{Rule: aws.String(name),
		Targets: []ebtypes.Target{{Id: aws.String("queue"), Arn: aws.String(ebQueueARN)}}}); err != nil {
		t.Fatal(err)
	}

	db := pgtest.New(t)
	msgs := ceMessages(t, db, "billing", "ledger")
	routes := fmt.Sprintf(`{"routes":[
	  {"match":{"namespace":"billing","topic":"*"},"format":"cloudevents","target":{"type":"sns","topic_arn":%q,"timeout":"30s"}},
	  {"match":{"namespace":"ledger","topic":"*"},"format":"cloudevents","target":{"type":"eventbridge","event_bus":"default","timeout":"30s"}}]}`,
		aws.ToString(topic.TopicArn))
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+routes, "AWS_ENDPOINT_URL="+srv.URL)...)
	dispatchAll(t, fn, func(s *dispatch.Summary) { invoke(t, fn, event(t, "dispatch-schedule.json"), 50*time.Second, s) }, len(msgs))

	receive := func(url string, want int) []sqstypes.Message {
		var out []sqstypes.Message
		for deadline := time.Now().Add(30 * time.Second); len(out) < want && time.Now().Before(deadline); {
			r, err := sqsc.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10,
				WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, r.Messages...)
		}
		if len(out) != want {
			t.Fatalf("the queue got %d messages, want %d", len(out), want)
		}
		return out
	}
	for _, q := range receive(snsQueue, 2) {
		ev := publishtest.ReadStructuredCloudEvent(t, []byte(aws.ToString(q.Body)))
		m := msgs[ev.ID()]
		if m == nil || m.Namespace != "billing" {
			t.Errorf("SNS delivered an event of id %q", ev.ID())
			continue
		}
		publishtest.CheckCloudEvent(t, ev, m, "/outbox/billing")
		if id := q.MessageAttributes["outbox.id"]; aws.ToString(id.StringValue) != m.ID.String() {
			t.Errorf("the outbox.id attribute is %v, want %s", id.StringValue, m.ID)
		}
		if h := q.MessageAttributes["X-Request-Id"]; m.DedupeKey != "" && aws.ToString(h.StringValue) != "r-billing" {
			t.Errorf("the producer's header attribute is %v, want r-billing", h.StringValue)
		}
	}
	for _, q := range receive(ebQueue, 2) {
		var delivered struct {
			Source     string          `json:"source"`
			DetailType string          `json:"detail-type"`
			Detail     json.RawMessage `json:"detail"`
		}
		if err := json.Unmarshal([]byte(aws.ToString(q.Body)), &delivered); err != nil {
			t.Fatalf("%s: %v", aws.ToString(q.Body), err)
		}
		ev := publishtest.ReadStructuredCloudEvent(t, delivered.Detail)
		m := msgs[ev.ID()]
		if m == nil || m.Namespace != "ledger" {
			t.Errorf("EventBridge delivered an event of id %q", ev.ID())
			continue
		}
		publishtest.CheckCloudEvent(t, ev, m, "/outbox/ledger")
		if delivered.Source != "outbox.ledger" || delivered.DetailType != m.Topic {
			t.Errorf("source %q detail-type %q, want outbox.ledger and %q", delivered.Source, delivered.DetailType, m.Topic)
		}
	}
}
