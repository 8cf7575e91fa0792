package offload_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/lambdainvoke"
	"github.com/outboxkit/dispatcher/shared/publish/offload"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/route"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/lambdafake"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
)

func TestMain(m *testing.M) { moto.Main(m) }

func unique(prefix string) string {
	return prefix + "-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
}

// payload is n bytes of JSON, different for each seed.
func payload(n int, seed string) json.RawMessage {
	head := fmt.Sprintf(`{"seed":%q,"pad":"`, seed)
	return json.RawMessage(head + strings.Repeat("x", n-len(head)-2) + `"}`)
}

func message(p json.RawMessage, attempt int) *outboxtype.Message {
	return &outboxtype.Message{Keys: outboxtype.Keys{ID: uuid.New(), Namespace: "billing", Topic: "invoice"},
		Payload: p, PayloadBytes: len(p), Attempt: attempt, CreatedAt: time.Now()}
}

func bucket(t *testing.T, client *s3.Client) string {
	t.Helper()
	name := unique("offload")
	if _, err := client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatal(err)
	}
	return name
}

func object(t *testing.T, client *s3.Client, bucket, key string) (body []byte, sse string) {
	t.Helper()
	out, err := client.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("get s3://%s/%s: %v", bucket, key, err)
	}
	defer out.Body.Close()
	body, err = io.ReadAll(out.Body)
	if err != nil {
		t.Fatal(err)
	}
	return body, string(out.ServerSideEncryption)
}

func keys(t *testing.T, client *s3.Client, bucket string) []string {
	t.Helper()
	out, err := client.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	if err != nil {
		t.Fatal(err)
	}
	var ks []string
	for _, o := range out.Contents {
		ks = append(ks, aws.ToString(o.Key))
	}
	return ks
}

// A 600 KB payload reaches an SNS subscriber (an SQS queue, raw delivery)
// as the payload-offloading pointer with ExtendedPayloadSize, its object
// holding the payload byte for byte; a payload under the threshold arrives
// inline; a retry of the large one rewrites the same object.
func TestSNSReceivesThePayloadOffloadingPointer(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "offload to S3 with an SNS target")
	ctx := context.Background()
	cfg := srv.Config()
	s3c, snsc, sqsc := s3.NewFromConfig(cfg), awssns.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	b := bucket(t, s3c)
	topic, err := snsc.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(unique("invoices"))})
	if err != nil {
		t.Fatal(err)
	}
	q, err := sqsc.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(unique("invoices"))})
	if err != nil {
		t.Fatal(err)
	}
	qa, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snsc.Subscribe(ctx, &awssns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"),
		Endpoint:   aws.String(qa.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]),
		Attributes: map[string]string{"RawMessageDelivery": "true"}}); err != nil {
		t.Fatal(err)
	}
	inner, err := sns.New(sns.NewClient(cfg, 4), sns.Config{TopicARN: aws.ToString(topic.TopicArn)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := offload.New(inner, s3c, offload.Config{Bucket: b, ThresholdBytes: 200_000, Prefix: "invoices/",
		URLTTL: time.Hour, TargetType: route.TypeSNS, TargetMaxBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}

	large, small := message(payload(600_000, "large"), 1), message(payload(1_000, "small"), 1)
	for i, r := range p.Publish(ctx, []*outboxtype.Message{large, small}) {
		if r.Kind != publish.Delivered {
			t.Fatalf("message %d: %+v", i, r)
		}
	}
	retry := *large
	retry.Attempt = 2
	if r := p.Publish(ctx, []*outboxtype.Message{&retry}); r[0].Kind != publish.Delivered {
		t.Fatalf("retry: %+v", r[0])
	}

	key := "invoices/" + large.ID.String() + ".json"
	if got := keys(t, s3c, b); len(got) != 1 || got[0] != key {
		t.Errorf("objects %v, want the one key %s for the message and its retry", got, key)
	}
	body, sse := object(t, s3c, b, key)
	if !bytes.Equal(body, large.Payload) {
		t.Errorf("the object holds %d bytes, not the payload's %d", len(body), len(large.Payload))
	}
	if sse != "AES256" {
		t.Errorf("server-side encryption %q, want AES256", sse)
	}

	wantPointer := fmt.Sprintf(`["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":%q,"s3Key":%q}]`, b, key)
	var pointers, inline int
	deadline := time.Now().Add(30 * time.Second)
	for pointers+inline < 3 && time.Now().Before(deadline) {
		out, err := sqsc.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: q.QueueUrl, MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			size, hasSize := m.MessageAttributes["ExtendedPayloadSize"]
			switch body := aws.ToString(m.Body); {
			case body == string(small.Payload):
				inline++
				if hasSize {
					t.Error("an inline message carries ExtendedPayloadSize")
				}
			case body == wantPointer:
				pointers++
				if !hasSize || aws.ToString(size.DataType) != "Number" || aws.ToString(size.StringValue) != strconv.Itoa(len(large.Payload)) {
					t.Errorf("ExtendedPayloadSize = %+v, want Number %d", size, len(large.Payload))
				}
			default:
				t.Errorf("unexpected body (%d bytes): %.200s", len(body), body)
			}
		}
	}
	if pointers != 2 || inline != 1 {
		t.Errorf("received %d pointers and %d inline, want 2 (the message and its retry) and 1", pointers, inline)
	}
}

// A webhook receives the envelope with a null payload, the offload object
// and the Outbox-Payload-Offloaded header, and fetches the payload from
// the presigned URL.
func TestWebhookFetchesThePresignedURL(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "offload to S3 with a webhook target")
	ctx := context.Background()
	s3c := s3.NewFromConfig(srv.Config())
	b := bucket(t, s3c)

	type received struct {
		env     publish.Envelope
		header  string
		fetched []byte
		err     error
	}
	got := make(chan received, 2)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var r received
		raw, _ := io.ReadAll(req.Body)
		r.err = json.Unmarshal(raw, &r.env)
		r.header = req.Header.Get(webhook.HeaderPayloadOffloaded)
		if r.err == nil && r.env.Offload != nil {
			var resp *http.Response
			if resp, r.err = http.Get(r.env.Offload.URL); r.err == nil {
				r.fetched, r.err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					r.err = fmt.Errorf("GET the presigned URL: %s", resp.Status)
				}
			}
		}
		got <- r
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	inner, err := webhook.New(receiver.Client(), webhook.Config{URL: receiver.URL, Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	p, err := offload.New(inner, s3c, offload.Config{Bucket: b, ThresholdBytes: 100_000, Prefix: "hooks/",
		URLTTL: 10 * time.Minute, TargetType: route.TypeHTTP, TargetMaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	large, small := message(payload(600_000, "large"), 1), message(payload(500, "small"), 1)
	sentAt := time.Now()
	for i, r := range p.Publish(ctx, []*outboxtype.Message{large, small}) {
		if r.Kind != publish.Delivered {
			t.Fatalf("message %d: %+v", i, r)
		}
	}
	for range 2 {
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		switch r.env.ID {
		case large.ID.String():
			o := r.env.Offload
			if o == nil || string(r.env.Payload) != "null" || r.header != "s3" {
				t.Fatalf("offloaded envelope: payload %.50s, offload %+v, header %q", r.env.Payload, o, r.header)
			}
			if o.S3Bucket != b || o.S3Key != "hooks/"+large.ID.String()+".json" || o.Size != len(large.Payload) {
				t.Errorf("offload %+v", o)
			}
			if !strings.Contains(o.URL, "X-Amz-Expires=600") || o.URLExpiresAt.Before(sentAt.Add(10*time.Minute-time.Second)) || o.URLExpiresAt.After(time.Now().Add(10*time.Minute)) {
				t.Errorf("the URL %s expires at %s, want 10 minutes after it was signed", o.URL, o.URLExpiresAt)
			}
			if !bytes.Equal(r.fetched, large.Payload) {
				t.Errorf("the presigned URL gave %d bytes, not the payload's %d", len(r.fetched), len(large.Payload))
			}
		case small.ID.String():
			if r.env.Offload != nil || r.header != "" || !bytes.Equal(r.env.Payload, small.Payload) {
				t.Errorf("the small payload was not sent inline: offload %+v, header %q", r.env.Offload, r.header)
			}
		default:
			t.Errorf("unexpected envelope %s", r.env.ID)
		}
	}
}

// recorder is a target that records what it was sent.
type recorder struct{ sent []*outboxtype.Message }

func (r *recorder) Publish(_ context.Context, msgs []*outboxtype.Message) []publish.Result {
	r.sent = append(r.sent, msgs...)
	return publish.Fill(len(msgs), publish.Ok("ok"))
}

// A payload that cannot be written (no such bucket) is not sent: it fails
// as the target's configuration would, the later messages of its ordering
// key come back Released, and other messages go on.
func TestAFailedWriteStopsItsOrderingKeyOnly(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "offload failures")
	s3c := s3.NewFromConfig(srv.Config())
	rec := &recorder{}
	p, err := offload.New(rec, s3c, offload.Config{Bucket: unique("missing"), ThresholdBytes: 1000, Prefix: "p/",
		URLTTL: time.Hour, TargetType: route.TypeEventBridge, TargetMaxBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	ordered := func(seq int64, n int) *outboxtype.Message {
		m := message(payload(n, "k"), 1)
		m.OrderingKey, m.SequenceID = "acct-1", seq
		return m
	}
	msgs := []*outboxtype.Message{ordered(1, 100), ordered(2, 5000), ordered(3, 100), message(payload(100, "other"), 1)}
	res := p.Publish(context.Background(), msgs)
	want := []publish.Kind{publish.Delivered, publish.Terminal, publish.Released, publish.Delivered}
	for i, r := range res {
		if r.Kind != want[i] {
			t.Errorf("message %d: %v (%v), want %v", i, r.Kind, r.Err, want[i])
		}
	}
	if res[1].Code != outboxtype.CodeTargetNotFound {
		t.Errorf("the failed write: %s %v, want TARGET_NOT_FOUND", res[1].Code, res[1].Err)
	}
	if len(rec.sent) != 2 || rec.sent[0] != msgs[0] || rec.sent[1] != msgs[3] {
		t.Errorf("sent %d messages, want the first and the last", len(rec.sent))
	}
}

// EventBridge Detail must be a JSON object: the pointer is one.
func TestEventBridgePointerIsAnObject(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "offload with an EventBridge target")
	s3c := s3.NewFromConfig(srv.Config())
	b := bucket(t, s3c)
	rec := &recorder{}
	p, err := offload.New(rec, s3c, offload.Config{Bucket: b, ThresholdBytes: 1000, Prefix: "eb/", URLTTL: time.Hour,
		TargetType: route.TypeEventBridge, TargetMaxBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	m := message(payload(5000, "eb"), 1)
	if r := p.Publish(context.Background(), []*outboxtype.Message{m}); r[0].Kind != publish.Delivered {
		t.Fatal(r[0])
	}
	want := fmt.Sprintf(`{"ExtendedPayloadSize":5000,"software.amazon.payloadoffloading.PayloadS3Pointer":{"s3BucketName":%q,"s3Key":"eb/%s.json"}}`, b, m.ID)
	if got := string(rec.sent[0].Payload); got != want {
		t.Errorf("detail %s, want %s", got, want)
	}
	if body, _ := object(t, s3c, b, "eb/"+m.ID.String()+".json"); !bytes.Equal(body, m.Payload) {
		t.Error("the object is not the payload")
	}
}

// A Lambda function receives the webhook's envelope: payload null, the
// offload object, a presigned URL that serves the payload.
func TestLambdaReceivesTheEnvelopeWithAPresignedURL(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "offload to S3 with a Lambda target")
	s3c := s3.NewFromConfig(srv.Config())
	b := bucket(t, s3c)
	fake := lambdafake.New(t)
	var env publish.Envelope
	var fetched []byte
	fake.Handle("sink", func(in []byte) (int, []byte, string) {
		fail := func(err error) (int, []byte, string) {
			return 0, []byte(fmt.Sprintf(`{"errorType":"Fetch","errorMessage":%q}`, err.Error())), "Unhandled"
		}
		if err := json.Unmarshal(in, &env); err != nil {
			return fail(err)
		}
		if env.Offload == nil {
			return fail(fmt.Errorf("no offload object in %.200s", in))
		}
		resp, err := http.Get(env.Offload.URL)
		if err != nil {
			return fail(err)
		}
		defer resp.Body.Close()
		if fetched, err = io.ReadAll(resp.Body); err != nil {
			return fail(err)
		}
		return 0, nil, ""
	})
	inner, err := lambdainvoke.New(lambda.NewFromConfig(fake.Config()), lambdainvoke.Config{Function: "sink"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := offload.New(inner, s3c, offload.Config{Bucket: b, ThresholdBytes: 100_000, Prefix: "fn/", URLTTL: time.Minute,
		TargetType: route.TypeLambda, TargetMaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m := message(payload(2_000_000, "fn"), 1)
	if r := p.Publish(context.Background(), []*outboxtype.Message{m}); r[0].Kind != publish.Delivered {
		t.Fatal(r[0])
	}
	if string(env.Payload) != "null" || env.Offload.S3Key != "fn/"+m.ID.String()+".json" || env.Offload.Size != len(m.Payload) {
		t.Errorf("envelope payload %.50s, offload %+v", env.Payload, env.Offload)
	}
	if !bytes.Equal(fetched, m.Payload) {
		t.Errorf("the presigned URL served %d bytes, not the payload's %d", len(fetched), len(m.Payload))
	}
}
