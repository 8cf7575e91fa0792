package eventbridge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
)

// answerAtOnce answers every request with one PutEvents answer of ten
// accepted entries, without a network.
type answerAtOnce struct{ body []byte }

func (a answerAtOnce) Do(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {jsonContentType}, "X-Amzn-Requestid": {"b1d45f2c"}},
		Body: io.NopCloser(bytes.NewReader(a.body)), ContentLength: int64(len(a.body)), Request: r}, nil
}

// BenchmarkPutEventsWithoutTheStack measures what the SDK's middleware
// stack costs a PutEvents call, as a proposal, not a path the publisher
// takes: "client" is the call through the client the publishers build
// (NewClient: this package's body, the SDK's stack); "signed" is the same
// request — the same body, its SHA-256, SigV4 by the SDK's signer with
// cached credentials — sent by hand and its answer decoded with
// encoding/json, without the stack's endpoint and auth resolution,
// retryer, clock-skew record, user agent and request id. Both go to a
// transport that answers at once, so each figure is the client's work
// alone.
//
//	go test -run '^$' -bench PutEventsWithoutTheStack -benchmem ./shared/publish/eventbridge
func BenchmarkPutEventsWithoutTheStack(b *testing.B) {
	answer := `{"Entries":[` + strings.Repeat(`{"EventId":"11111111-2222-3333-4444-555555555555"},`, 9) +
		`{"EventId":"11111111-2222-3333-4444-555555555555"}],"FailedEntryCount":0}`
	transport := answerAtOnce{[]byte(answer)}
	const region, endpoint = "eu-west-1", "http://127.0.0.1:1/"
	cfg := aws.Config{Region: region, Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")),
		HTTPClient: transport, BaseEndpoint: aws.String(endpoint)}
	detail := `{"tenant_id":"tenant-42","tokens":1200,"pad":"` + strings.Repeat("x", 460) + `"}`
	at := time.Now()
	entries := make([]types.PutEventsRequestEntry, MaxEntriesPerCall)
	for i := range entries {
		entries[i] = types.PutEventsRequestEntry{Source: aws.String("outbox.billing"), DetailType: aws.String("usage"),
			Detail: aws.String(detail), EventBusName: aws.String("default"), Time: &at}
	}
	input := &eventbridge.PutEventsInput{Entries: entries}

	b.Run("client", func(b *testing.B) {
		client := NewClient(cfg)
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
			body := appendPutEventsRequest(nil, input)
			sum := sha256.Sum256(body)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("X-Amz-Target", putEventsTarget)
			req.Header.Set("Content-Type", jsonContentType)
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
			if err != nil || len(out.Entries) != MaxEntriesPerCall {
				b.Fatalf("answer: %+v, %v", out, err)
			}
		}
	})
}
