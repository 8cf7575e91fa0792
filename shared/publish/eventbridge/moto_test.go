package eventbridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

func TestMain(m *testing.M) { moto.Main(m) }

// motoTimeout bounds each PutEvents to moto: these tests prove delivery,
// not latency, and moto (Python) on a busy machine can take seconds a call.
const motoTimeout = time.Minute

// deliveredEvent is the event EventBridge hands an SQS target. (moto 5.2
// leaves out the event's "account", which real EventBridge sends; nothing
// here depends on it.)
type deliveredEvent struct {
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Time       time.Time       `json:"time"`
	Region     string          `json:"region"`
	Resources  []string        `json:"resources"`
	Detail     json.RawMessage `json:"detail"`
}

// routeToQueue makes a rule on bus matching source and targeting a fresh
// SQS queue, creating the bus unless it is "default", and returns the
// queue's URL.
func routeToQueue(t *testing.T, cfg aws.Config, bus, source string) string {
	t.Helper()
	ctx := context.Background()
	eb, sq := awseb.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	name := "outbox-" + uuid.NewString()[:8]
	if bus != "default" {
		if _, err := eb.CreateEventBus(ctx, &awseb.CreateEventBusInput{Name: aws.String(bus)}); err != nil {
			t.Fatal(err)
		}
	}
	queue, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	attrs, err := sq.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: queue.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		t.Fatal(err)
	}
	pattern, _ := json.Marshal(map[string][]string{"source": {source}})
	if _, err := eb.PutRule(ctx, &awseb.PutRuleInput{
		Name: aws.String(name), EventBusName: aws.String(bus), EventPattern: aws.String(string(pattern)),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := eb.PutTargets(ctx, &awseb.PutTargetsInput{
		Rule: aws.String(name), EventBusName: aws.String(bus),
		Targets: []ebtypes.Target{{Id: aws.String("queue"), Arn: aws.String(attrs.Attributes["QueueArn"])}},
	}); err != nil {
		t.Fatal(err)
	}
	return *queue.QueueUrl
}

// drain receives every message on the queue until it answers empty.
func drain(t *testing.T, cfg aws.Config, queueURL string) []deliveredEvent {
	t.Helper()
	sq := sqs.NewFromConfig(cfg)
	var out []deliveredEvent
	for {
		resp, err := sq.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 0,
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Messages) == 0 {
			return out
		}
		for _, m := range resp.Messages {
			var e deliveredEvent
			if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &e); err != nil {
				t.Fatalf("queue message %q: %v", aws.ToString(m.Body), err)
			}
			out = append(out, e)
			if _, err := sq.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkDelivered checks the queue holds exactly the matching messages, each
// once, as the events the publisher's results name.
func checkDelivered(t *testing.T, events []deliveredEvent, msgs []*outboxtype.Message, results []publish.Result, matching func(*outboxtype.Message) bool) {
	t.Helper()
	want := map[uuid.UUID]int{}
	for i, m := range msgs {
		if results[i].Kind != publish.Delivered {
			t.Fatalf("message %d: %s %s %v", i, results[i].Kind, results[i].Code, results[i].Err)
		}
		if matching(m) {
			want[m.ID] = i
		}
	}
	seen := map[uuid.UUID]bool{}
	for _, e := range events {
		id, err := publishtest.MessageID(e.Detail)
		if err != nil {
			t.Fatalf("event detail %s: %v", e.Detail, err)
		}
		i, ok := want[id]
		if !ok || seen[id] {
			t.Errorf("the queue got message %s (wanted: %v, seen before: %v)", id, ok, seen[id])
			continue
		}
		seen[id] = true
		m := msgs[i]
		if e.ID != results[i].TargetRef || e.Source != "outbox."+m.Namespace || e.DetailType != m.Topic ||
			!e.Time.Equal(m.CreatedAt.Truncate(time.Second)) || e.Region != moto.Region || len(e.Resources) != 0 {
			t.Errorf("message %d arrived as id %s, source %s, detail-type %s, time %s, region %s, resources %v; want id %s, source outbox.%s, detail-type %s, time %s",
				i, e.ID, e.Source, e.DetailType, e.Time, e.Region, e.Resources,
				results[i].TargetRef, m.Namespace, m.Topic, m.CreatedAt.Truncate(time.Second).UTC())
		}
		if !jsonEqual(t, e.Detail, m.Payload) {
			t.Errorf("message %d detail %s, want the payload %s", i, e.Detail, m.Payload)
		}
	}
	if len(seen) != len(want) {
		t.Errorf("the queue got %d of the %d matching messages", len(seen), len(want))
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

func TestMotoCustomBusRuleToQueue(t *testing.T) {
	srv := moto.Start(t, "EventBridge delivery through a custom bus rule to SQS")
	cfg := srv.Config()
	suffix := uuid.NewString()[:8]
	bus := "orders-" + suffix
	namespace := "billing-" + suffix
	queueURL := routeToQueue(t, cfg, bus, "outbox."+namespace)

	msgs := publishtest.Messages(15, 300)
	for i, m := range msgs {
		m.Namespace, m.Topic = namespace, []string{"invoice_paid", "usage_snapshot"}[i%2]
		if i%5 == 4 {
			m.Namespace = "other-" + suffix // on the bus, but no rule matches it
		}
	}
	arn := fmt.Sprintf("arn:aws:events:%s:%s:event-bus/%s", moto.Region, moto.AccountID, bus)
	p, err := eventbridge.New(awseb.NewFromConfig(cfg), eventbridge.Config{EventBus: arn, Timeout: motoTimeout})
	if err != nil {
		t.Fatal(err)
	}
	results := p.Publish(context.Background(), msgs)
	checkDelivered(t, drain(t, cfg, queueURL), msgs, results, func(m *outboxtype.Message) bool { return m.Namespace == namespace })
}

func TestMotoDefaultBus(t *testing.T) {
	srv := moto.Start(t, "EventBridge delivery through the default bus to SQS")
	cfg := srv.Config()
	namespace := "usage-" + uuid.NewString()[:8]
	queueURL := routeToQueue(t, cfg, "default", "outbox."+namespace)

	msgs := publishtest.Messages(4, 128)
	for _, m := range msgs {
		m.Namespace, m.Topic = namespace, "usage_snapshot"
	}
	p, err := eventbridge.New(awseb.NewFromConfig(cfg), eventbridge.Config{EventBus: "default", Timeout: motoTimeout})
	if err != nil {
		t.Fatal(err)
	}
	results := p.Publish(context.Background(), msgs)
	checkDelivered(t, drain(t, cfg, queueURL), msgs, results, func(*outboxtype.Message) bool { return true })
}

func TestMotoMissingBus(t *testing.T) {
	srv := moto.Start(t, "PutEvents to a bus that does not exist")
	p, err := eventbridge.New(awseb.NewFromConfig(srv.Config()), eventbridge.Config{EventBus: "missing-" + uuid.NewString()[:8], Timeout: motoTimeout})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range p.Publish(context.Background(), publishtest.Messages(3, 64)) {
		if r.Kind != publish.Terminal || r.Code != outboxtype.CodeTargetNotFound {
			t.Errorf("message %d: %s %s %v, want terminal TARGET_NOT_FOUND", i, r.Kind, r.Code, r.Err)
		}
	}
}
