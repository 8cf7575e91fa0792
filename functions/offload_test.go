package functions_test

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
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// The dispatch function offloads large payloads to S3 (moto): a 600 KB
// invoice reaches an SNS subscriber (SQS, raw delivery) as the AWS
// payload-offloading pointer with ExtendedPayloadSize, its object holding
// the payload byte for byte, while a small one arrives inline; a webhook
// receives the envelope with a presigned URL it fetches the payload from,
// and a retry of that delivery rewrites the same object.
func TestDispatchOffloadsLargePayloadsToS3(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "claim-check offload to S3")
	ctx := context.Background()
	cfg := srv.Config()
	s3c, snsc, sqsc := s3.NewFromConfig(cfg), awssns.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	name := "offload-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	if _, err := s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatal(err)
	}
	topic, err := snsc.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	queue, err := sqsc.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	qattrs, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: queue.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snsc.Subscribe(ctx, &awssns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"),
		Endpoint:   aws.String(qattrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]),
		Attributes: map[string]string{"RawMessageDelivery": "true"}}); err != nil {
		t.Fatal(err)
	}

	// The webhook refuses the large message's first delivery, so that it is
	// retried, and fetches the payload from the presigned URL each time.
	var (
		mu       sync.Mutex
		requests = map[string]int{}
		fetched  = map[string][]byte{}
		problems []string
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		raw, _ := io.ReadAll(req.Body)
		var env publish.Envelope
		if err := json.Unmarshal(raw, &env); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body := []byte(env.Payload)
		if env.Offload != nil {
			resp, err := http.Get(env.Offload.URL)
			if err == nil {
				body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if err != nil || resp.StatusCode != http.StatusOK || req.Header.Get(webhook.HeaderPayloadOffloaded) != "s3" {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("%s: fetch %v, header %q", env.ID, err, req.Header.Get(webhook.HeaderPayloadOffloaded)))
				mu.Unlock()
			}
		}
		mu.Lock()
		defer mu.Unlock()
		requests[env.ID]++
		fetched[env.ID] = body
		if env.Offload != nil && requests[env.ID] == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	db := pgtest.New(t)
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.limits SET max_payload_bytes = 1048576`); err != nil {
		t.Fatal(err)
	}
	limits, err := outbox.LoadLimits(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	invoice := func(n int, seed string) json.RawMessage {
		head := fmt.Sprintf(`{"invoice":%q,"lines":"`, seed)
		return json.RawMessage(head + strings.Repeat("l", n-len(head)-2) + `"}`)
	}
	msgs := []outbox.Message{
		{Namespace: "billing", Topic: "invoice", DedupeKey: "inv-large", Payload: invoice(600_000, "inv-large")},
		{Namespace: "billing", Topic: "invoice", DedupeKey: "inv-small", Payload: invoice(2_000, "inv-small")},
		{Namespace: "billing", Topic: "usage", DedupeKey: "use-large", Payload: invoice(600_000, "use-large")},
		{Namespace: "billing", Topic: "usage", DedupeKey: "use-small", Payload: invoice(2_000, "use-small")},
	}
	enq, err := outbox.Producer{Limits: limits}.EnqueueBatch(ctx, db.Pool, msgs)
	if err != nil {
		t.Fatal(err)
	}
	// What the dispatcher claims, and sends inline, is the payload as the
	// database stores it (jsonb's text): the objects must hold that.
	for i := range msgs {
		var text string
		if err := db.Pool.QueryRow(ctx, `SELECT $1::jsonb::text`, string(msgs[i].Payload)).Scan(&text); err != nil {
			t.Fatal(err)
		}
		msgs[i].Payload = json.RawMessage(text)
	}
	routes := fmt.Sprintf(`{"routes":[
	  {"match":{"namespace":"billing","topic":"invoice"},"max_payload_bytes":1048576,
	   "offload":{"bucket":%q,"threshold_bytes":200000,"prefix":"invoices/"},
	   "target":{"type":"sns","topic_arn":%q,"timeout":"30s"}},
	  {"match":{"namespace":"billing","topic":"usage"},"max_payload_bytes":1048576,
	   "offload":{"bucket":%q,"threshold_bytes":200000,"prefix":"usage/","url_ttl":"15m"},
	   "retry":{"base_delay":"0s","max_delay":"0s"},
	   "target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET","timeout":"30s"}}]}`,
		name, aws.ToString(topic.TopicArn), name, receiver.URL)
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+routes, "AWS_ENDPOINT_URL="+srv.URL)...)

	var sum dispatch.Summary
	for i := 0; i < 5 && sum.Delivered < 4; i++ {
		var one dispatch.Summary
		invoke(t, fn, event(t, "dispatch-schedule.json"), 50*time.Second, &one)
		if one.Dead != 0 {
			t.Fatalf("invocation %d: %+v\n%s", i, one, fn.Stderr())
		}
		sum.Delivered += one.Delivered
		sum.Retried += one.Retried
	}
	if sum.Delivered != 4 || sum.Retried != 1 {
		t.Fatalf("delivered %d, retried %d; want 4 and the webhook's one refusal\n%s", sum.Delivered, sum.Retried, fn.Stderr())
	}

	// SNS: the pointer and the inline payload.
	invoiceKey := "invoices/" + enq[0].ID.String() + ".json"
	wantPointer := fmt.Sprintf(`["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":%q,"s3Key":%q}]`, name, invoiceKey)
	var bodies []string
	for deadline := time.Now().Add(30 * time.Second); len(bodies) < 2 && time.Now().Before(deadline); {
		out, err := sqsc.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: queue.QueueUrl, MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			body := aws.ToString(m.Body)
			bodies = append(bodies, body)
			size, ok := m.MessageAttributes["ExtendedPayloadSize"]
			switch body {
			case wantPointer:
				if !ok || aws.ToString(size.DataType) != "Number" || aws.ToString(size.StringValue) != strconv.Itoa(len(msgs[0].Payload)) {
					t.Errorf("the pointer's ExtendedPayloadSize is %+v, want Number %d", size, len(msgs[0].Payload))
				}
			case string(msgs[1].Payload):
				if ok {
					t.Error("the inline message carries ExtendedPayloadSize")
				}
			default:
				t.Errorf("SNS delivered an unexpected body of %d bytes: %.200s", len(body), body)
			}
		}
	}
	if len(bodies) != 2 {
		t.Fatalf("the subscriber received %d messages, want 2", len(bodies))
	}
	obj, err := s3c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(name), Key: aws.String(invoiceKey)})
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := io.ReadAll(obj.Body)
	obj.Body.Close()
	if !bytes.Equal(stored, msgs[0].Payload) {
		t.Errorf("the object holds %d bytes, not the payload's %d", len(stored), len(msgs[0].Payload))
	}
	if obj.ServerSideEncryption != "AES256" {
		t.Errorf("the object's server-side encryption is %q, want AES256", obj.ServerSideEncryption)
	}

	// The webhook: both deliveries of the large payload fetched it; one
	// object for them.
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the webhook receiver: %v", problems)
	}
	large, small := enq[2].ID.String(), enq[3].ID.String()
	if requests[large] != 2 || requests[small] != 1 {
		t.Errorf("webhook requests: large %d, small %d; want 2 and 1", requests[large], requests[small])
	}
	// Inline, the payload is compacted into the envelope's JSON.
	var smallPayload bytes.Buffer
	if err := json.Compact(&smallPayload, msgs[3].Payload); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fetched[large], msgs[2].Payload) || !bytes.Equal(fetched[small], smallPayload.Bytes()) {
		t.Errorf("the webhook got %d and %d bytes, want %d and %d", len(fetched[large]), len(fetched[small]), len(msgs[2].Payload), smallPayload.Len())
	}
	list, err := s3c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(name), Prefix: aws.String("usage/")})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Contents) != 1 || aws.ToString(list.Contents[0].Key) != "usage/"+large+".json" {
		t.Errorf("%d objects under usage/, want the one for the message and its retry", len(list.Contents))
	}
}
