package sns_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

func TestMain(m *testing.M) { moto.Main(m) }

// emulator is a moto server with clients for it.
type emulator struct {
	cfg aws.Config
	sns *awssns.Client
	sqs *sqs.Client
}

func startMoto(t *testing.T, unchecked string) emulator {
	t.Helper()
	srv := moto.Start(t, unchecked)
	cfg := srv.Config()
	return emulator{cfg: cfg, sns: awssns.NewFromConfig(cfg), sqs: sqs.NewFromConfig(cfg)}
}

// uniqueName is a resource name no other test uses on the shared emulator.
func uniqueName(prefix string) string {
	return prefix + "-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
}

// subscribedQueue creates a queue subscribed to topicARN and returns its URL.
func (e emulator) subscribedQueue(t *testing.T, topicARN, name string, raw bool) string {
	t.Helper()
	ctx := context.Background()
	attrs := map[string]string{}
	if strings.HasSuffix(name, ".fifo") {
		attrs["FifoQueue"] = "true"
	}
	q, err := e.sqs.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: q.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		t.Fatal(err)
	}
	sub := &awssns.SubscribeInput{
		TopicArn: aws.String(topicARN), Protocol: aws.String("sqs"),
		Endpoint: aws.String(got.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]),
	}
	if raw {
		sub.Attributes = map[string]string{"RawMessageDelivery": "true"}
	}
	if _, err := e.sns.Subscribe(ctx, sub); err != nil {
		t.Fatal(err)
	}
	return aws.ToString(q.QueueUrl)
}

// drain receives (and deletes) messages until want have arrived, then
// checks that nothing more is waiting.
func (e emulator) drain(t *testing.T, queueURL string, want int) []sqstypes.Message {
	t.Helper()
	ctx := context.Background()
	var out []sqstypes.Message
	receive := func(wait int32) int {
		r, err := e.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: wait,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range r.Messages {
			if _, err := e.sqs.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, r.Messages...)
		return len(r.Messages)
	}
	deadline := time.Now().Add(15 * time.Second)
	for len(out) < want && time.Now().Before(deadline) {
		receive(1)
	}
	if len(out) != want {
		t.Fatalf("%s: %d messages arrived, want %d", queueURL, len(out), want)
	}
	if n := receive(0); n != 0 {
		t.Errorf("%s: %d messages more than were published", queueURL, n)
	}
	return out
}

func checkAllDelivered(t *testing.T, results []publish.Result) {
	t.Helper()
	for i, r := range results {
		if r.Kind != publish.Delivered || r.TargetRef == "" {
			t.Fatalf("message %d: %s %s %v, want delivered", i, r.Kind, r.Code, r.Err)
		}
	}
}

// variedMessages covers every optional key present and absent.
func variedMessages() []*outboxtype.Message {
	msgs := publishtest.Messages(14, 300)
	msgs[1].SequenceID, msgs[1].OrderingKey = 42, "account-1"
	msgs[2].TraceHeader = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	msgs[3].TenantID, msgs[3].DedupeKey, msgs[3].Headers = "", "", nil
	msgs[4].Headers["content-kind"] = "invoice.v2"
	msgs[5].Attempt = 7
	return msgs
}

// Against moto: a standard topic delivers exactly the published messages
// to its SQS subscriptions — raw delivery carries the body and every
// attribute as SQS message attributes; the SNS envelope carries the
// MessageId the publisher reported.
func TestMotoStandardTopicDeliversToSQS(t *testing.T) {
	t.Parallel()
	e := startMoto(t, "SNS PublishBatch delivery to SQS subscriptions")
	ctx := context.Background()
	name := uniqueName("outbox-std")
	topic, err := e.sns.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	topicARN := aws.ToString(topic.TopicArn)
	rawQueue := e.subscribedQueue(t, topicARN, name+"-raw", true)
	envelopeQueue := e.subscribedQueue(t, topicARN, name+"-envelope", false)

	pub, err := sns.New(sns.NewClient(e.cfg, sns.DefaultConcurrency), sns.Config{TopicARN: topicARN})
	if err != nil {
		t.Fatal(err)
	}
	msgs := variedMessages()
	results := pub.Publish(ctx, msgs)
	checkAllDelivered(t, results)

	byID := map[string]int{}
	for i, m := range msgs {
		byID[m.ID.String()] = i
	}
	for _, got := range e.drain(t, rawQueue, len(msgs)) {
		id := aws.ToString(got.MessageAttributes[sns.AttributeID].StringValue)
		i, ok := byID[id]
		if !ok {
			t.Errorf("raw delivery of an unknown message %q", id)
			continue
		}
		m := msgs[i]
		if aws.ToString(got.Body) != string(m.Payload) {
			t.Errorf("message %d: body %q, want %q", i, aws.ToString(got.Body), m.Payload)
		}
		want := expectedAttributes(m)
		if len(got.MessageAttributes) != len(want) {
			t.Errorf("message %d: %d attributes, want %d", i, len(got.MessageAttributes), len(want))
		}
		for name, w := range want {
			g := got.MessageAttributes[name]
			if aws.ToString(g.DataType) != w.DataType || aws.ToString(g.StringValue) != w.StringValue {
				t.Errorf("message %d: attribute %s = %s %q, want %s %q", i, name, aws.ToString(g.DataType), aws.ToString(g.StringValue), w.DataType, w.StringValue)
			}
		}
		delete(byID, id)
	}
	if len(byID) != 0 {
		t.Errorf("%d messages never arrived by raw delivery", len(byID))
	}

	refs := map[string]int{}
	for i, r := range results {
		refs[r.TargetRef] = i
	}
	for _, got := range e.drain(t, envelopeQueue, len(msgs)) {
		var envelope struct {
			MessageID string `json:"MessageId"`
			TopicArn  string
			Message   string
		}
		if err := json.Unmarshal([]byte(aws.ToString(got.Body)), &envelope); err != nil {
			t.Fatalf("SNS envelope: %v", err)
		}
		i, ok := refs[envelope.MessageID]
		if !ok {
			t.Errorf("SNS MessageId %s is no result's target ref", envelope.MessageID)
			continue
		}
		if envelope.TopicArn != topicARN || envelope.Message != string(msgs[i].Payload) {
			t.Errorf("message %d: envelope %+v", i, envelope)
		}
		delete(refs, envelope.MessageID)
	}
}

// Against moto: a FIFO topic passes the group and deduplication ids to a
// FIFO queue, with and without ordering and dedupe keys, hashed where they
// do not fit.
func TestMotoFIFOTopicCarriesGroupAndDeduplicationIDs(t *testing.T) {
	t.Parallel()
	e := startMoto(t, "SNS FIFO PublishBatch group and deduplication ids")
	ctx := context.Background()
	name := uniqueName("outbox-fifo")
	topic, err := e.sns.CreateTopic(ctx, &awssns.CreateTopicInput{
		Name: aws.String(name + ".fifo"), Attributes: map[string]string{"FifoTopic": "true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	topicARN := aws.ToString(topic.TopicArn)
	queue := e.subscribedQueue(t, topicARN, name+".fifo", true)

	pub, err := sns.New(sns.NewClient(e.cfg, sns.DefaultConcurrency), sns.Config{TopicARN: topicARN})
	if err != nil {
		t.Fatal(err)
	}
	if !pub.FIFO() {
		t.Fatal("the publisher does not see a FIFO topic")
	}
	msgs := publishtest.Messages(4, 100)
	msgs[0].OrderingKey, msgs[0].SequenceID = "account-1", 1
	msgs[1].DedupeKey = ""
	msgs[2].OrderingKey = strings.Repeat("o", 150)
	msgs[3].OrderingKey, msgs[3].DedupeKey = "account 2", "clé-ünicode"
	want := map[string]struct{ group, dedup string }{
		msgs[0].ID.String(): {"account-1", "conformance|suite|" + msgs[0].DedupeKey},
		msgs[1].ID.String(): {sns.DefaultGroupID, msgs[1].ID.String()},
		msgs[2].ID.String(): {hexSHA256(msgs[2].OrderingKey), "conformance|suite|" + msgs[2].DedupeKey},
		msgs[3].ID.String(): {hexSHA256("account 2"), hexSHA256("conformance|suite|clé-ünicode")},
	}

	checkAllDelivered(t, pub.Publish(ctx, msgs))

	for _, got := range e.drain(t, queue, len(msgs)) {
		id := aws.ToString(got.MessageAttributes[sns.AttributeID].StringValue)
		w, ok := want[id]
		if !ok {
			t.Errorf("an unknown message %q arrived", id)
			continue
		}
		group := got.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)]
		dedup := got.Attributes[string(sqstypes.MessageSystemAttributeNameMessageDeduplicationId)]
		if group != w.group || dedup != w.dedup {
			t.Errorf("message %s: group %q, dedup %q; want %q, %q", id, group, dedup, w.group, w.dedup)
		}
		delete(want, id)
	}
	if len(want) != 0 {
		t.Errorf("%d messages never arrived", len(want))
	}
}

// Against moto: a message over the topic's real cap, sent because the
// publisher was configured with a larger one, is refused by SNS as
// "Invalid parameter: Message too long", the InvalidParameter code of any
// bad parameter: it is recorded as PAYLOAD_TOO_LARGE, as an operator
// filtering dead letters by that code expects, and its neighbours are
// delivered.
func TestMotoMessageTooLongIsPayloadTooLarge(t *testing.T) {
	t.Parallel()
	e := startMoto(t, "SNS's refusal of a message over 256 KiB")
	ctx := context.Background()
	topic, err := e.sns.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(uniqueName("outbox-cap"))})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := sns.New(sns.NewClient(e.cfg, sns.DefaultConcurrency), sns.Config{
		TopicARN: aws.ToString(topic.TopicArn), MaxMessageBytes: sns.MaxMessageBytesLimit})
	if err != nil {
		t.Fatal(err)
	}
	msgs := publishtest.Messages(3, 64)
	msgs[1].Payload = json.RawMessage(`{"blob":"` + strings.Repeat("x", 300<<10) + `"}`)
	results := pub.Publish(ctx, msgs)
	if r := results[1]; r.Kind != publish.Terminal || r.Code != outboxtype.CodePayloadTooLarge {
		t.Errorf("the 300 KiB message: %s %s %v, want terminal PAYLOAD_TOO_LARGE", r.Kind, r.Code, r.Err)
	}
	for _, i := range []int{0, 2} {
		if r := results[i]; r.Kind != publish.Delivered {
			t.Errorf("message %d: %s %s %v, want delivered beside the refused one", i, r.Kind, r.Code, r.Err)
		}
	}
}
