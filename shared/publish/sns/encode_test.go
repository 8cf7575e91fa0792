package sns

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

func TestNameRule(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]Rule{
		"x-suite":                     "",
		"Content_Type.v2":             "",
		strings.Repeat("n", 256):      "",
		strings.Repeat("n", 257):      RuleNameTooLong,
		"":                            RuleEmptyName,
		"AWS.x":                       RuleNameReservedPrefix,
		"aws.x":                       RuleNameReservedPrefix,
		"Amazon.x":                    RuleNameReservedPrefix,
		"AMAZON.x":                    RuleNameReservedPrefix,
		"awsx":                        "",
		"outbox.id":                   RuleNameOutboxPrefix,
		"Outbox.Whatever":             RuleNameOutboxPrefix,
		".lead":                       RuleNamePeriods,
		"trail.":                      RuleNamePeriods,
		"a..b":                        RuleNamePeriods,
		"has space":                   RuleNameCharacters,
		"ünicode":                     RuleNameCharacters,
		"colon:name":                  RuleNameCharacters,
		"a.b.c":                       "",
		"0-leading-digit_and_under__": "",
	} {
		if got := nameRule(name); got != want {
			t.Errorf("nameRule(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestValidText(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"plain":               true,
		"tab\tlf\ncr\r":       true,
		"ünïcödé 日本 😀":        true,
		"\uFFFD is real":      true,
		"":                    true,
		"nul\x00":             false,
		"bell\x07":            false,
		"bad utf8 \xff":       false,
		"cut \xe6\x97":        false,
		"noncharacter \uFFFE": false,
		"noncharacter \uFFFF": false,
	} {
		if got := validText(s); got != want {
			t.Errorf("validText(%q) = %t, want %t", s, got, want)
		}
	}
}

func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestFIFOIDs(t *testing.T) {
	t.Parallel()
	printable := `AZaz09!"#$%&'()*+,-./:;<=>?@[\]^_` + "`{|}~"
	for key, want := range map[string]string{
		"order-42":               "order-42",
		printable:                printable,
		strings.Repeat("k", 128): strings.Repeat("k", 128),
		strings.Repeat("k", 129): hexSHA256(strings.Repeat("k", 129)),
		"has space":              hexSHA256("has space"),
		"ünicode":                hexSHA256("ünicode"),
		"tab\t":                  hexSHA256("tab\t"),
	} {
		got := fifoID(key)
		if got != want {
			t.Errorf("fifoID(%q) = %q, want %q", key, got, want)
		}
		if !validFIFOID(got) {
			t.Errorf("fifoID(%q) = %q is not a valid FIFO id", key, got)
		}
	}

	id := uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8057")
	m := &outboxtype.Message{Keys: outboxtype.Keys{ID: id, Namespace: "payments", Topic: "invoice_paid"}}
	if got := deduplicationID(m); got != id.String() {
		t.Errorf("without a dedupe key: %q, want the message id", got)
	}
	m.DedupeKey = "invoice-42"
	if got := deduplicationID(m); got != "payments|invoice_paid|invoice-42" {
		t.Errorf("with a dedupe key: %q", got)
	}
	other := *m
	other.Topic = "invoice_created"
	if deduplicationID(&other) == deduplicationID(m) {
		t.Error("one dedupe key in two topics gives one deduplication id: SNS would drop the second message")
	}
	m.DedupeKey = strings.Repeat("k", 120)
	if got, want := deduplicationID(m), hexSHA256("payments|invoice_paid|"+m.DedupeKey); got != want {
		t.Errorf("long scoped key: %q, want its SHA-256 %q", got, want)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	valid := Config{TopicARN: "arn:aws:sns:eu-west-1:123456789012:payments.fifo"}
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string // "" when valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"china partition", func(c *Config) { c.TopicARN = "arn:aws-cn:sns:cn-north-1:123456789012:t" }, ""},
		{"missing topic", func(c *Config) { c.TopicARN = "" }, "TopicARN"},
		{"not an ARN", func(c *Config) { c.TopicARN = "payments" }, "TopicARN"},
		{"not SNS", func(c *Config) { c.TopicARN = "arn:aws:sqs:eu-west-1:123456789012:q" }, "TopicARN"},
		{"subscription ARN", func(c *Config) { c.TopicARN = "arn:aws:sns:eu-west-1:123456789012:t:8a21d249" }, "TopicARN"},
		{"group id with a space", func(c *Config) { c.DefaultGroupID = "my group" }, "DefaultGroupID"},
		{"group id too long", func(c *Config) { c.DefaultGroupID = strings.Repeat("g", 129) }, "DefaultGroupID"},
		{"negative size", func(c *Config) { c.MaxMessageBytes = -1 }, "MaxMessageBytes"},
		{"size over 1 MiB", func(c *Config) { c.MaxMessageBytes = 1<<20 + 1 }, "MaxMessageBytes"},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second }, "Timeout"},
		{"negative concurrency", func(c *Config) { c.Concurrency = -1 }, "Concurrency"},
	} {
		cfg := valid
		tc.edit(&cfg)
		p, err := New(struct{ API }{}, cfg)
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field != "" && (err == nil || !strings.Contains(err.Error(), tc.field)):
			t.Errorf("%s: error %v, want one naming %s", tc.name, err, tc.field)
		case tc.field == "" && (p.defaultGroupID != DefaultGroupID || p.maxMessageBytes != DefaultMaxMessageBytes ||
			p.timeout != DefaultTimeout || p.batcher.Concurrency != DefaultConcurrency):
			t.Errorf("%s: defaults not applied: %+v", tc.name, p)
		}
	}
	if _, err := New(nil, valid); err == nil {
		t.Error("New accepted a nil client")
	}
	if p, _ := New(struct{ API }{}, valid); !p.FIFO() {
		t.Error("a .fifo topic is not FIFO")
	}
	if p, _ := New(struct{ API }{}, Config{TopicARN: "arn:aws:sns:eu-west-1:123456789012:fifo-ish"}); p.FIFO() {
		t.Error("a standard topic is FIFO")
	}
}

// NewClient keeps enough idle connections for the calls in flight.
func TestNewClientSizesTheConnectionPool(t *testing.T) {
	t.Parallel()
	for _, inFlight := range []int{4, 32} {
		client := NewClient(aws.Config{Region: "us-east-1"}, inFlight)
		buildable, ok := client.Options().HTTPClient.(*awshttp.BuildableClient)
		if !ok {
			t.Fatalf("HTTP client %T", client.Options().HTTPClient)
		}
		tr := buildable.GetTransport()
		if tr.MaxIdleConnsPerHost < inFlight || (tr.MaxIdleConns != 0 && tr.MaxIdleConns < inFlight) {
			t.Errorf("%d in flight: MaxIdleConnsPerHost %d, MaxIdleConns %d", inFlight, tr.MaxIdleConnsPerHost, tr.MaxIdleConns)
		}
		if got := client.Options().Retryer.MaxAttempts(); got != ClientMaxAttempts {
			t.Errorf("retryer max attempts %d, want %d", got, ClientMaxAttempts)
		}
	}
	// A caller's own HTTP client is left alone.
	own := &http.Client{}
	if got := NewClient(aws.Config{Region: "us-east-1", HTTPClient: own}, 8).Options().HTTPClient; got != own {
		t.Errorf("HTTP client replaced: %T", got)
	}
}

// instantTopic answers every PublishBatch at once, each entry published:
// no network, no SDK, only what the publisher itself costs.
type instantTopic struct{ ids [maxBatchEntries]*string }

func (t *instantTopic) PublishBatch(_ context.Context, in *sns.PublishBatchInput, _ ...func(*sns.Options)) (*sns.PublishBatchOutput, error) {
	out := &sns.PublishBatchOutput{Successful: make([]types.PublishBatchResultEntry, len(in.PublishBatchRequestEntries))}
	for j, e := range in.PublishBatchRequestEntries {
		out.Successful[j] = types.PublishBatchResultEntry{Id: e.Id, MessageId: t.ids[j]}
	}
	return out, nil
}

// BenchmarkPublishOverhead is the publisher's own work per message around
// the SDK's: encoding (attributes, validation, size, FIFO ids), scheduling
// and answering, with a topic that answers at once. The messages are one
// ordering key's, in calls of ten one after another, and then the same
// messages without a key.
//
//	go test -run '^$' -bench PublishOverhead -benchmem ./shared/publish/sns
func BenchmarkPublishOverhead(b *testing.B) {
	topic := &instantTopic{}
	for j := range topic.ids {
		topic.ids[j] = aws.String(uuid.NewString())
	}
	for _, name := range []string{"orders", "orders.fifo"} {
		for _, ordered := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/ordered=%t", name, ordered), func(b *testing.B) {
				p, err := New(topic, Config{TopicARN: "arn:aws:sns:eu-west-1:123456789012:" + name})
				if err != nil {
					b.Fatal(err)
				}
				msgs := make([]*outboxtype.Message, 1000)
				for i := range msgs {
					id := uuid.Must(uuid.NewV7())
					msgs[i] = &outboxtype.Message{
						Keys: outboxtype.Keys{
							ID: id, Namespace: "billing", Topic: "usage", TenantID: "tenant-42", DedupeKey: "usage-" + id.String(),
						},
						Attempt: 1, Payload: []byte(`{"tenant_id":"tenant-42","tokens_in":1200,"pad":"` + strings.Repeat("x", 440) + `"}`),
						Headers: map[string]string{"content-kind": "usage.v1"},
					}
					if ordered {
						msgs[i].OrderingKey, msgs[i].SequenceID = "account-7", int64(i+1)
					}
				}
				b.ReportAllocs()
				for b.Loop() {
					for i, r := range p.Publish(context.Background(), msgs) {
						if r.Kind != publish.Delivered {
							b.Fatalf("message %d: %s %s %v", i, r.Kind, r.Code, r.Err)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
			})
		}
	}
}

// An offloaded message carries ExtendedPayloadSize as a Number, after the
// headers (a header of that name cannot shadow it), and the attribute
// counts toward SNS's ten.
func TestEncodeOffloadedMessage(t *testing.T) {
	t.Parallel()
	p, err := New(struct{ API }{}, Config{TopicARN: "arn:aws:sns:eu-west-1:123456789012:invoices"})
	if err != nil {
		t.Fatal(err)
	}
	m := &outboxtype.Message{Keys: outboxtype.Keys{ID: uuid.New(), Namespace: "billing", Topic: "invoice"}, Attempt: 1,
		Payload: []byte(`["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"b","s3Key":"k"}]`),
		Headers: map[string]string{"ExtendedPayloadSize": "1"}, Offload: &outboxtype.Offload{Bucket: "b", Key: "k", Size: 600000}}
	entry, _, err := p.encode(m)
	if err != nil {
		t.Fatal(err)
	}
	got := entry.MessageAttributes[AttributeExtendedPayloadSize]
	if aws.ToString(got.DataType) != "Number" || aws.ToString(got.StringValue) != "600000" {
		t.Errorf("ExtendedPayloadSize = %s %s, want Number 600000", aws.ToString(got.DataType), aws.ToString(got.StringValue))
	}
	m.Headers = map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6"}
	if _, _, err := p.encode(m); err == nil || !strings.Contains(err.Error(), string(RuleTooManyAttributes)) {
		t.Errorf("4 attributes, 6 headers and ExtendedPayloadSize: err = %v, want too many attributes", err)
	}
}

// X-Ray's form of a traceparent, which the claim gives a message that has
// no X-Ray header, never costs the message its delivery: where it would
// make eleven attributes, it is left out, and the traceparent carries the
// trace. A producer's own X-Ray header still counts.
func TestDerivedTraceHeaderGivesWayToSNSsTenAttributes(t *testing.T) {
	t.Parallel()
	p, err := New(struct{ API }{}, Config{TopicARN: "arn:aws:sns:eu-west-1:123456789012:invoices"})
	if err != nil {
		t.Fatal(err)
	}
	const traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	m := &outboxtype.Message{Keys: outboxtype.Keys{ID: uuid.New(), Namespace: "billing", Topic: "invoice", TenantID: "t", DedupeKey: "d"},
		Attempt: 1, Payload: []byte(`{}`), TraceHeader: "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1",
		Headers: map[string]string{"traceparent": traceParent, "tracestate": "rojo=1", "x-request-id": "r", "x-b": "b"}}
	entry, _, err := p.encode(m)
	if err != nil {
		t.Fatalf("4 attributes, tenant, dedupe key, 4 headers and a derived trace header: %v", err)
	}
	if _, ok := entry.MessageAttributes[AttributeTraceHeader]; ok || len(entry.MessageAttributes) != 10 {
		t.Errorf("attributes %v, want 10 without %s", entry.MessageAttributes, AttributeTraceHeader)
	}
	m.TraceHeader = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	if _, _, err := p.encode(m); err == nil || !strings.Contains(err.Error(), string(RuleTooManyAttributes)) {
		t.Errorf("with the producer's own X-Ray header: err = %v, want too many attributes", err)
	}
	delete(m.Headers, "x-b")
	m.TraceHeader = "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1"
	if entry, _, err = p.encode(m); err != nil || aws.ToString(entry.MessageAttributes[AttributeTraceHeader].StringValue) != m.TraceHeader {
		t.Errorf("within ten: %v, %v; want the derived trace header sent", err, entry.MessageAttributes[AttributeTraceHeader])
	}
}
