package sns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// capturedRequest is what a client put on the wire for one call, less what
// differs between two calls of the same input (the signature, its time,
// the invocation id).
type capturedRequest struct {
	method, url string
	header      http.Header
	body        string
}

// captureClient is an HTTP client that records each request and answers it
// with an error (the call's outcome does not matter here).
type captureClient struct{ got []capturedRequest }

var errCaptured = errors.New("captured")

func (c *captureClient) Do(r *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	h := r.Header.Clone()
	for _, volatile := range []string{"Authorization", "X-Amz-Date", "Amz-Sdk-Invocation-Id", "Amz-Sdk-Request"} {
		h.Del(volatile)
	}
	c.got = append(c.got, capturedRequest{method: r.Method, url: r.URL.String(), header: h, body: string(body)})
	return nil, errCaptured
}

// wireOf sends in through a real SNS client, with this package's serializer
// or the SDK's, and returns what went on the wire; or, for an input the
// SDK refuses before serializing it (a required field missing), its error.
func wireOf(t *testing.T, endpoint string, in *sns.PublishBatchInput, ours bool) (capturedRequest, error) {
	t.Helper()
	capture := &captureClient{}
	cfg := aws.Config{
		Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		BaseEndpoint: aws.String(endpoint), HTTPClient: capture, Retryer: func() aws.Retryer { return aws.NopRetryer{} },
	}
	client := sns.NewFromConfig(cfg, func(o *sns.Options) {
		if ours {
			o.APIOptions = append(o.APIOptions, swapPublishBatchSerializer)
		}
	})
	_, err := client.PublishBatch(context.Background(), in)
	if !errors.Is(err, errCaptured) {
		if len(capture.got) != 0 {
			t.Fatalf("PublishBatch sent a request and failed with %v", err)
		}
		return capturedRequest{}, err
	}
	if len(capture.got) != 1 {
		t.Fatalf("%d requests sent, want 1", len(capture.got))
	}
	return capture.got[0], nil
}

// checkSameWire fails unless this package's serializer sends exactly what
// the SDK's sends for in.
func checkSameWire(t *testing.T, name, endpoint string, in *sns.PublishBatchInput) (sent int) {
	t.Helper()
	sdk, sdkErr := wireOf(t, endpoint, in, false)
	ours, ourErr := wireOf(t, endpoint, in, true)
	if sdkErr != nil || ourErr != nil {
		if fmt.Sprint(sdkErr) != fmt.Sprint(ourErr) {
			t.Errorf("%s: %v, the SDK's %v", name, ourErr, sdkErr)
		}
		return
	}
	sent++
	if ours.method != sdk.method || ours.url != sdk.url {
		t.Errorf("%s: %s %s, the SDK's %s %s", name, ours.method, ours.url, sdk.method, sdk.url)
	}
	if fmt.Sprint(ours.header) != fmt.Sprint(sdk.header) {
		t.Errorf("%s: headers\n%v\nthe SDK's\n%v", name, ours.header, sdk.header)
	}
	if ours.body != sdk.body {
		at := 0
		for at < min(len(ours.body), len(sdk.body)) && ours.body[at] == sdk.body[at] {
			at++
		}
		t.Errorf("%s: the bodies differ from byte %d:\n ours %.200q\n SDK  %.200q", name, at, ours.body[at:], sdk.body[at:])
	}
	return sent
}

// The serializer that replaces the SDK's for PublishBatch writes the same
// request, byte for byte: the publisher's own entries, to standard and
// FIFO topics; every field an entry can have, binary attributes, values
// that need escaping, more entries and attributes than SNS allows (their
// numbers past 9 sort as strings); an empty list; an endpoint with a path
// and a query; and random entries.
func TestSerializerWritesWhatTheSDKWrites(t *testing.T) {
	t.Parallel()
	const endpoint = "https://sns.eu-west-1.amazonaws.com"
	for _, topic := range []string{"arn:aws:sns:eu-west-1:123456789012:orders", "arn:aws:sns:eu-west-1:123456789012:orders.fifo"} {
		p, err := New(instantClient{}, Config{TopicARN: topic})
		if err != nil {
			t.Fatal(err)
		}
		msgs := publishtest.OrderedMessages("key with spaces/and+signs", 10, 512)
		msgs[3].Headers = map[string]string{"x-quoted": `"a&b=c%d"`, "x-unicode": "café ✓ \t\n"}
		entries := make([]types.PublishBatchRequestEntry, len(msgs))
		for i, m := range msgs {
			if entries[i], _, err = p.encode(m); err != nil {
				t.Fatal(err)
			}
			entries[i].Id = entryIDs[i]
		}
		if checkSameWire(t, "the publisher's entries to "+topic, endpoint,
			&sns.PublishBatchInput{TopicArn: aws.String(topic), PublishBatchRequestEntries: entries}) != 1 {
			t.Errorf("the publisher's entries to %s were refused before they were sent", topic)
		}
	}

	every := func(n, attrs int) []types.PublishBatchRequestEntry {
		entries := make([]types.PublishBatchRequestEntry, n)
		for i := range entries {
			a := map[string]types.MessageAttributeValue{}
			for k := range attrs {
				a[fmt.Sprintf("attr.%c%d", 'z'-k, k)] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(fmt.Sprintf("v %d+%d=~*'()!", i, k))}
			}
			a["bin"] = types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: []byte{0, 1, 0xfe, 0xff, byte(i)}}
			a["empty"] = types.MessageAttributeValue{DataType: aws.String("String.custom"), StringValue: aws.String("")}
			entries[i] = types.PublishBatchRequestEntry{
				Id: aws.String(fmt.Sprint(i)), Message: aws.String(fmt.Sprintf(`{"n":%d,"s":"a b&c=d/e?f#g%%h"}`, i)),
				MessageAttributes: a, MessageDeduplicationId: aws.String(fmt.Sprintf("dedupe-%d", i)),
				MessageGroupId: aws.String("group/1"), MessageStructure: aws.String("json"), Subject: aws.String("Subject ü"),
			}
		}
		return entries
	}
	sent := checkSameWire(t, "every field, 12 entries of 13 attributes", endpoint,
		&sns.PublishBatchInput{TopicArn: aws.String("arn:aws:sns:eu-west-1:123456789012:t"), PublishBatchRequestEntries: every(12, 11)})
	sent += checkSameWire(t, "an entry with only the fields SNS requires", endpoint,
		&sns.PublishBatchInput{TopicArn: aws.String("t"), PublishBatchRequestEntries: []types.PublishBatchRequestEntry{{Id: aws.String("0"), Message: aws.String("")}}})
	sent += checkSameWire(t, "an endpoint with a path and a query", "http://127.0.0.1:4566/some/path?b=2&a=1+x",
		&sns.PublishBatchInput{TopicArn: aws.String("t"), PublishBatchRequestEntries: every(2, 1)})
	if sent != 3 {
		t.Errorf("%d of the 3 valid inputs were sent", sent)
	}
	// Inputs the SDK refuses before its serializer runs: refused alike.
	checkSameWire(t, "an empty list", endpoint, &sns.PublishBatchInput{TopicArn: aws.String("t"), PublishBatchRequestEntries: []types.PublishBatchRequestEntry{}})
	checkSameWire(t, "no list", endpoint, &sns.PublishBatchInput{TopicArn: aws.String("t")})

	rng := rand.New(rand.NewPCG(1, 2))
	text := func() string {
		const alphabet = "aZ09 .-_~+&=%/?#\"'{}:,\t\né✓"
		runes := []rune(alphabet)
		var b strings.Builder
		for range rng.IntN(40) {
			b.WriteRune(runes[rng.IntN(len(runes))])
		}
		return b.String()
	}
	maybe := func() *string {
		if rng.IntN(4) == 0 {
			return nil
		}
		return aws.String(text())
	}
	sent = 0
	for round := range 300 {
		entries := make([]types.PublishBatchRequestEntry, 1+rng.IntN(12))
		for i := range entries {
			var attrs map[string]types.MessageAttributeValue
			if n := rng.IntN(13); n > 0 {
				attrs = map[string]types.MessageAttributeValue{}
				for range n {
					v := types.MessageAttributeValue{DataType: aws.String(text()), StringValue: maybe()}
					if rng.IntN(5) == 0 {
						v.BinaryValue = []byte(text())
					}
					attrs[text()] = v
				}
			}
			entries[i] = types.PublishBatchRequestEntry{
				Id: aws.String(fmt.Sprint(i)), Message: aws.String(text()), MessageAttributes: attrs, MessageDeduplicationId: maybe(),
				MessageGroupId: maybe(), MessageStructure: maybe(), Subject: maybe(),
			}
		}
		sent += checkSameWire(t, fmt.Sprintf("random input %d", round), endpoint, &sns.PublishBatchInput{TopicArn: aws.String(text() + "t"), PublishBatchRequestEntries: entries})
		if t.Failed() {
			break
		}
	}
	if sent < 100 {
		t.Errorf("only %d of 300 random inputs passed the SDK's validation and were compared", sent)
	}
}

// The serializer leaves every other operation to the SDK's.
func TestSerializerLeavesOtherOperationsToTheSDK(t *testing.T) {
	t.Parallel()
	capture := &captureClient{}
	client := sns.NewFromConfig(aws.Config{
		Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		BaseEndpoint: aws.String("https://sns.eu-west-1.amazonaws.com"), HTTPClient: capture,
		Retryer: func() aws.Retryer { return aws.NopRetryer{} },
	}, func(o *sns.Options) { o.APIOptions = append(o.APIOptions, swapPublishBatchSerializer) })
	if _, err := client.Publish(context.Background(), &sns.PublishInput{TopicArn: aws.String("t"), Message: aws.String("m")}); !errors.Is(err, errCaptured) {
		t.Fatalf("Publish: %v", err)
	}
	if want := "Action=Publish&Message=m&TopicArn=t&Version=2010-03-31"; len(capture.got) != 1 || capture.got[0].body != want {
		t.Fatalf("Publish sent %+v, want the body %q", capture.got, want)
	}
}

// instantClient is an API that is never called: New wants one.
type instantClient struct{}

func (instantClient) PublishBatch(context.Context, *sns.PublishBatchInput, ...func(*sns.Options)) (*sns.PublishBatchOutput, error) {
	return nil, errors.New("not called")
}
