package sns

import (
	"context"
	"encoding/xml"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// answeringClient answers every request with one body, as SNS would.
type answeringClient struct {
	status int
	body   string
}

func (c answeringClient) Do(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	h := http.Header{}
	h.Set("Content-Type", "text/xml")
	h.Set("X-Amzn-RequestId", "b1d45f2c-0000-4000-8000-000000000000")
	return &http.Response{StatusCode: c.status, Header: h, Body: io.NopCloser(strings.NewReader(c.body)), Request: r, ContentLength: int64(len(c.body))}, nil
}

// outputOf is what a PublishBatch call answered body returns, through this
// package's deserializer or the SDK's.
func outputOf(t testing.TB, status int, body string, ours bool) (*sns.PublishBatchOutput, error) {
	cfg := aws.Config{
		Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		HTTPClient: answeringClient{status: status, body: body}, Retryer: func() aws.Retryer { return aws.NopRetryer{} },
	}
	client := sns.NewFromConfig(cfg, func(o *sns.Options) {
		if ours {
			o.APIOptions = append(o.APIOptions, swapPublishBatchDeserializer)
		}
	})
	return client.PublishBatch(context.Background(), &sns.PublishBatchInput{
		TopicArn:                   aws.String("arn:aws:sns:eu-west-1:123456789012:t"),
		PublishBatchRequestEntries: []types.PublishBatchRequestEntry{{Id: aws.String("0"), Message: aws.String("m")}},
	})
}

// sameOutput compares two calls' outcomes: both refused, or the same
// entries.
func sameOutput(t testing.TB, body string, status int) {
	t.Helper()
	sdk, sdkErr := outputOf(t, status, body, false)
	ours, oursErr := outputOf(t, status, body, true)
	if (sdkErr == nil) != (oursErr == nil) {
		t.Fatalf("answer %q: the SDK's deserializer says %v, this package's %v", body, sdkErr, oursErr)
	}
	if sdkErr != nil {
		if sdkErr.Error() != oursErr.Error() {
			t.Fatalf("answer %q: the SDK's deserializer says %v, this package's %v", body, sdkErr, oursErr)
		}
		return
	}
	if !reflect.DeepEqual(sdk.Successful, ours.Successful) || !reflect.DeepEqual(sdk.Failed, ours.Failed) {
		t.Fatalf("answer %q:\nthe SDK's deserializer: %s\nthis package's:         %s", body, describe(sdk), describe(ours))
	}
}

func describe(o *sns.PublishBatchOutput) string {
	var b strings.Builder
	b.WriteString("successful")
	if o.Successful == nil {
		b.WriteString(" nil")
	}
	for _, e := range o.Successful {
		b.WriteString(" {" + str(e.Id) + " " + str(e.MessageId) + " " + str(e.SequenceNumber) + "}")
	}
	b.WriteString("; failed")
	if o.Failed == nil {
		b.WriteString(" nil")
	}
	for _, e := range o.Failed {
		fault := "false"
		if e.SenderFault {
			fault = "true"
		}
		b.WriteString(" {" + str(e.Id) + " " + str(e.Code) + " " + str(e.Message) + " " + fault + "}")
	}
	return b.String()
}

func str(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return "\"" + *s + "\""
}

// answers are PublishBatch answers: those SNS and its fakes write, which
// the fast path must read, then forms it leaves to the SDK.
var (
	plainAnswers = []string{
		// SNS's documented form.
		`<PublishBatchResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/">
  <PublishBatchResult>
    <Successful>
      <member>
        <MessageId>e6d4ac48-2a1b-5a4b-9c2d-1b6c1f2e3d4a</MessageId>
        <Id>0</Id>
      </member>
      <member>
        <MessageId>f7e5bd59-3b2c-6b5c-ad3e-2c7d2a3f4e5b</MessageId>
        <Id>1</Id>
        <SequenceNumber>10000000000000003000</SequenceNumber>
      </member>
    </Successful>
    <Failed>
      <member>
        <Code>InvalidParameter</Code>
        <Id>2</Id>
        <Message>Invalid parameter: Message too long</Message>
        <SenderFault>true</SenderFault>
      </member>
      <member><Id>3</Id><Code>InternalError</Code><Message></Message><SenderFault>false</SenderFault></member>
    </Failed>
  </PublishBatchResult>
  <ResponseMetadata>
    <RequestId>b1d45f2c-0000-4000-8000-000000000000</RequestId>
  </ResponseMetadata>
</PublishBatchResponse>`,
		// encoding/xml's, as the wire-level fake writes it.
		xml.Header + `<PublishBatchResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><PublishBatchResult><Successful><member><Id>0</Id><MessageId>m-0</MessageId></member></Successful><Failed></Failed></PublishBatchResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult><Successful/><Failed/></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult><Successful><member><Id/><MessageId></MessageId></member></Successful><Successful><member><Id>again</Id></member></Successful></PublishBatchResult>`,
	}
	otherAnswers = []string{
		``,
		`   `,
		`<PublishBatchResponse><PublishBatchResult><Failed><member><Id>0</Id><Message>a &lt;b&gt; &amp; c</Message></member></Failed></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult><Failed><member><Id>0</Id><Message><![CDATA[x]]></Message></member></Failed></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><!-- c --><PublishBatchResult><Successful><member><Id>0</Id></member></Successful></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult><Successful><member><id>0</id><messageid>m</messageid></member></Successful></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult><Failed><member><Id>0</Id><SenderFault>1</SenderFault></member></Failed></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult><Failed><member><Id>0</Id><SenderFault>yes</SenderFault></member></Failed></PublishBatchResult></PublishBatchResponse>`,
		"<PublishBatchResponse>\r\n<PublishBatchResult>\r\n<Successful><member><Id>0\r\n</Id></member></Successful></PublishBatchResult></PublishBatchResponse>",
		`<PublishBatchResponse><PublishBatchResult><Successful><member><Id>0</Id><Extra><Deep>x</Deep></Extra></member></Successful><Unknown/></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><Other/><PublishBatchResult><Successful><member><Id>0</Id></member></Successful></PublishBatchResult></PublishBatchResponse>`,
		`<Wrapped><PublishBatchResult><Successful><member><Id>0</Id></member></Successful></PublishBatchResult></Wrapped>`,
		`<PublishBatchResponse><PublishBatchResult><Successful><member a="1"><Id>0</Id></member></Successful></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult><Successful><member><Id> spaced </Id><MessageId>ünïcode</MessageId></member></Successful></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult><Successful><member><Id>0</Id>`,
		`<PublishBatchResponse><PublishBatchResult><Successful><member><Id>0</Id></Member></Successful></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse xmlns:s="urn:x"><s:PublishBatchResult><Successful><member><Id>0</Id></member></Successful></s:PublishBatchResult></PublishBatchResponse>`,
		` <?xml version="1.0" encoding="UTF-8"?><PublishBatchResponse><PublishBatchResult></PublishBatchResult></PublishBatchResponse>`,
		`<?xml version="1.0" encoding="ISO-8859-1"?><PublishBatchResponse><PublishBatchResult></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse a="x>y"><PublishBatchResult><Successful><member><Id>0</Id></member></Successful></PublishBatchResult></PublishBatchResponse>`,
		`<PublishBatchResponse><PublishBatchResult><Successful><member><Id>0</Id></member></Successful></PublishBatchResult><ResponseMetadata><RequestId>&bogus;</RequestId>`,
	}
)

// The answers SNS writes are read without the SDK's decoder; every answer,
// read or not, gives what the SDK's deserializer gives.
func TestDeserializerBuildsWhatTheSDKBuilds(t *testing.T) {
	t.Parallel()
	for _, body := range plainAnswers {
		if _, ok := parsePublishBatchResponse([]byte(body)); !ok {
			t.Errorf("the fast path does not read %q", body)
		}
		sameOutput(t, body, http.StatusOK)
	}
	for _, body := range otherAnswers {
		sameOutput(t, body, http.StatusOK)
	}
	// An error status is the SDK's to read.
	sameOutput(t, `<ErrorResponse><Error><Type>Sender</Type><Code>InvalidParameter</Code><Message>m</Message></Error><RequestId>r</RequestId></ErrorResponse>`, http.StatusBadRequest)
}

// Other operations keep the SDK's deserializer.
func TestOnlyPublishBatchGetsTheFastDeserializer(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"Publish", "ListTopics", publishBatchOperation} {
		stack := newStackWithDeserializer(op)
		if err := swapPublishBatchDeserializer(stack); err != nil {
			t.Fatal(err)
		}
		got, _ := stack.Deserialize.Get(deserializerID)
		_, swapped := got.(*publishBatchDeserializer)
		if swapped != (op == publishBatchOperation) {
			t.Errorf("%s: swapped %v", op, swapped)
		}
	}
}

func FuzzDeserializerBuildsWhatTheSDKBuilds(f *testing.F) {
	for _, body := range append(append([]string{}, plainAnswers...), otherAnswers...) {
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body string) {
		sameOutput(t, body, http.StatusOK)
	})
}

// newStackWithDeserializer is an operation's stack holding a stand-in for
// the SDK's deserializer.
func newStackWithDeserializer(operation string) *middleware.Stack {
	stack := middleware.NewStack(operation, smithyhttp.NewStackRequest)
	_ = stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc(deserializerID, func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
		return next.HandleDeserialize(ctx, in)
	}), middleware.After)
	return stack
}
