package eventbridge_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/eventbridge"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// BenchmarkPublishLittlesLaw measures throughput against Little's law: with
// every PutEvents call taking a fixed latency, Publish can deliver at most
// 10 entries × Concurrency calls per latency. It publishes 10,000 messages
// of about 512 bytes, in Publish calls of 1,000, through a real SDK client
// to the wire-level fake answering each call after 20 ms, and reports
// msgs/s, the bound, the ceiling of the batch shape and their ratio
// (publishtest.BenchLittlesLaw).
//
//	go test -run '^$' -bench LittlesLaw -benchtime 3x ./shared/publish/eventbridge
func BenchmarkPublishLittlesLaw(b *testing.B) {
	shape := publishtest.LittlesLaw{
		Messages: 10_000, PerPublish: 1_000, PayloadBytes: 512,
		Latency: 20 * time.Millisecond, Concurrency: 8, PerCall: eventbridge.MaxEntriesPerCall,
	}
	fake := eventbridgefake.New(b)
	fake.SetLatency(shape.Latency)
	p, err := eventbridge.New(awseb.NewFromConfig(fake.Config()), eventbridge.Config{EventBus: "bench", Concurrency: shape.Concurrency})
	if err != nil {
		b.Fatal(err)
	}
	publishtest.BenchLittlesLaw(b, p, shape)
}

// instantBus answers every PutEvents at once, each entry accepted: no
// network, no SDK. It exists only to measure what the publisher itself
// costs per message (entry building, packing, fan-out, result mapping);
// every behaviour is tested through the real SDK client instead.
type instantBus struct{ ids []string }

func (b instantBus) PutEvents(_ context.Context, in *awseb.PutEventsInput, _ ...func(*awseb.Options)) (*awseb.PutEventsOutput, error) {
	out := &awseb.PutEventsOutput{Entries: make([]ebtypes.PutEventsResultEntry, len(in.Entries))}
	for i := range out.Entries {
		out.Entries[i].EventId = &b.ids[i]
	}
	return out, nil
}

// BenchmarkPublishOverhead is the publisher's own cost per message, in
// Publish calls of 1,000 messages of 512 bytes, with a target that answers
// instantly.
func BenchmarkPublishOverhead(b *testing.B) {
	bus := instantBus{ids: make([]string, eventbridge.MaxEntriesPerCall)}
	for i := range bus.ids {
		bus.ids[i] = fmt.Sprintf("event-%d", i)
	}
	p, err := eventbridge.New(bus, eventbridge.Config{EventBus: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	msgs := publishtest.Messages(1_000, 512)
	b.ReportAllocs()
	for b.Loop() {
		for i, r := range p.Publish(context.Background(), msgs) {
			if r.Kind != publish.Delivered {
				b.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
}

// cannedAnswer answers every request at once with one PutEvents answer of
// ten accepted entries: no network, so that what is measured is the SDK
// client's own work per call.
type cannedAnswer struct{ body []byte }

func (c cannedAnswer) Do(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/x-amz-json-1.1"}, "X-Amzn-Requestid": {"b1d45f2c"}},
		Body: io.NopCloser(bytes.NewReader(c.body)), ContentLength: int64(len(c.body)), Request: r}, nil
}

// tenAcceptedAnswer is EventBridge's answer to a call of ten entries, all
// accepted.
var tenAcceptedAnswer = []byte(`{"Entries":[` + strings.Repeat(`{"EventId":"11111111-2222-3333-4444-555555555555"},`, 9) +
	`{"EventId":"11111111-2222-3333-4444-555555555555"}],"FailedEntryCount":0}`)

// tenEntries is one PutEvents call's worth of 512-byte entries.
func tenEntries() []ebtypes.PutEventsRequestEntry {
	detail := `{"tenant_id":"tenant-42","tokens":1200,"pad":"` + strings.Repeat("x", 460) + `"}`
	at := time.Now()
	entries := make([]ebtypes.PutEventsRequestEntry, eventbridge.MaxEntriesPerCall)
	for i := range entries {
		entries[i] = ebtypes.PutEventsRequestEntry{Source: aws.String("outbox.billing"), DetailType: aws.String("usage"),
			Detail: aws.String(detail), EventBusName: aws.String("default"), Time: &at}
	}
	return entries
}

// BenchmarkPutEventsCall is one PutEvents call of ten entries of about 512
// bytes through the SDK's client — serializing, signing, the payload hash,
// the middleware, reading the answer — with the SDK's JSON codec and with
// this package's (NewClient), to a transport that answers at once.
//
//	go test -run '^$' -bench PutEventsCall -benchmem ./shared/publish/eventbridge
func BenchmarkPutEventsCall(b *testing.B) {
	cfg := aws.Config{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		HTTPClient: cannedAnswer{tenAcceptedAnswer}, BaseEndpoint: aws.String("http://127.0.0.1:1")}
	entries := tenEntries()
	for _, c := range []struct {
		name   string
		client *awseb.Client
	}{{"sdk", awseb.NewFromConfig(cfg)}, {"codec", eventbridge.NewClient(cfg)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.client.PutEvents(context.Background(), &awseb.PutEventsInput{Entries: entries}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPutEventsWithoutTheStack measures what the SDK's middleware
// stack costs a PutEvents call, as a proposal, not a path the publisher
// takes: "client" is the call through the client the publishers build
// (eventbridge.NewClient: this package's body, the SDK's stack); "signed" is the same
// request — the same body, its SHA-256, SigV4 by the SDK's signer with
// cached credentials — sent by hand and its answer decoded with
// encoding/json, without the stack's endpoint and auth resolution,
// retryer, clock-skew record, user agent and request id. Both go to a
// transport that answers at once, so each figure is the client's work
// alone.
//
//	go test -run '^$' -bench PutEventsWithoutTheStack -benchmem ./shared/publish/eventbridge
func BenchmarkPutEventsWithoutTheStack(b *testing.B) {
	transport := cannedAnswer{tenAcceptedAnswer}
	const region, endpoint = "eu-west-1", "http://127.0.0.1:1/"
	cfg := aws.Config{Region: region, Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")),
		HTTPClient: transport, BaseEndpoint: aws.String(endpoint)}
	input := &awseb.PutEventsInput{Entries: tenEntries()}

	b.Run("client", func(b *testing.B) {
		client := eventbridge.NewClient(cfg)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := client.PutEvents(context.Background(), input); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("signed", func(b *testing.B) {
		signer := v4.NewSigner()
		b.ReportAllocs()
		for b.Loop() {
			ctx := context.Background()
			body := eventbridge.AppendPutEventsRequest(nil, input)
			sum := sha256.Sum256(body)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("X-Amz-Target", eventbridge.PutEventsTarget)
			req.Header.Set("Content-Type", eventbridge.JSONContentType)
			creds, err := cfg.Credentials.Retrieve(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := signer.SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), "events", region, time.Now()); err != nil {
				b.Fatal(err)
			}
			resp, err := transport.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			var out struct {
				Entries []struct {
					EventID      *string `json:"EventId"`
					ErrorCode    *string
					ErrorMessage *string
				}
				FailedEntryCount int32
			}
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || len(out.Entries) != eventbridge.MaxEntriesPerCall {
				b.Fatalf("answer: %+v, %v", out, err)
			}
		}
	})
}
