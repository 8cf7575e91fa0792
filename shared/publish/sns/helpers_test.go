package sns_test

import (
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
)

const (
	standardTopic = "orders"
	fifoTopic     = "orders.fifo"
)

// bundle is a publisher wired to a fresh fake.
type bundle struct {
	fake *snsfake.Server
	pub  *sns.Publisher
}

type setupOptions struct {
	cfg      sns.Config
	fake     []snsfake.Option
	noRetrys bool // a client without SDK retries
}

// setup builds a fake and a publisher for it, through NewClient as a
// function would. An empty TopicARN means the standard topic.
func setup(t testing.TB, o setupOptions) bundle {
	t.Helper()
	fake := snsfake.New(t, o.fake...)
	if o.cfg.TopicARN == "" {
		o.cfg.TopicARN = snsfake.TopicARN(standardTopic)
	}
	var optFns []func(*awssns.Options)
	if o.noRetrys {
		optFns = append(optFns, func(opts *awssns.Options) { opts.Retryer = aws.NopRetryer{} })
	}
	concurrency := o.cfg.Concurrency
	if concurrency == 0 {
		concurrency = sns.DefaultConcurrency
	}
	pub, err := sns.New(sns.NewClient(fake.Config(), concurrency, optFns...), o.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{fake: fake, pub: pub}
}

// expectedAttributes is what the publisher must send for m, computed from
// the documented contract rather than from the publisher's code.
func expectedAttributes(m *outboxtype.Message) map[string]snsfake.Attribute {
	str := func(v string) snsfake.Attribute { return snsfake.Attribute{DataType: "String", StringValue: v} }
	num := func(v int64) snsfake.Attribute {
		return snsfake.Attribute{DataType: "Number", StringValue: strconv.FormatInt(v, 10)}
	}
	want := map[string]snsfake.Attribute{
		"outbox.id":        str(m.ID.String()),
		"outbox.namespace": str(m.Namespace),
		"outbox.topic":     str(m.Topic),
		"outbox.attempt":   num(int64(m.Attempt)),
	}
	if m.TenantID != "" {
		want["outbox.tenant_id"] = str(m.TenantID)
	}
	if m.DedupeKey != "" {
		want["outbox.dedupe_key"] = str(m.DedupeKey)
	}
	if m.SequenceID != 0 {
		want["outbox.sequence_id"] = num(m.SequenceID)
	}
	if m.TraceHeader != "" {
		want["outbox.trace_header"] = str(m.TraceHeader)
	}
	for k, v := range m.Headers {
		want[k] = str(v)
	}
	return want
}

// snsSize is m's size as SNS counts it, from the expected attributes.
func snsSize(m *outboxtype.Message) int {
	n := len(m.Payload)
	for name, a := range expectedAttributes(m) {
		n += len(name) + len(a.DataType) + len(a.StringValue)
	}
	return n
}

// checkDelivered checks that results[i] is delivered, with the MessageId
// the fake gave that very message, exactly when delivered(i); and that the
// fake received exactly those messages, once each, with the expected body
// and attributes.
func checkDelivered(t *testing.T, fake *snsfake.Server, msgs []*outboxtype.Message, results []publish.Result, delivered func(i int) bool) {
	t.Helper()
	if len(results) != len(msgs) {
		t.Fatalf("%d results for %d messages", len(results), len(msgs))
	}
	received := map[string]snsfake.Entry{}
	for _, e := range fake.Received() {
		if _, dup := received[e.OutboxID.String()]; dup {
			t.Errorf("message %s received twice", e.OutboxID)
		}
		received[e.OutboxID.String()] = e
	}
	for i, m := range msgs {
		r := results[i]
		e, got := received[m.ID.String()]
		delete(received, m.ID.String())
		if !delivered(i) {
			if r.Kind == publish.Delivered || got {
				t.Errorf("message %d: %s (received %t), want not delivered", i, r.Kind, got)
			}
			continue
		}
		if r.Kind != publish.Delivered || !got || r.TargetRef != e.MessageID {
			t.Errorf("message %d: %s %s %v ref %q (received %t, MessageId %q), want delivered with its MessageId",
				i, r.Kind, r.Code, r.Err, r.TargetRef, got, e.MessageID)
			continue
		}
		if e.Message != string(m.Payload) {
			t.Errorf("message %d: body %q, want the payload %q", i, e.Message, m.Payload)
		}
		want := expectedAttributes(m)
		if len(e.Attributes) != len(want) {
			t.Errorf("message %d: attributes %v, want %v", i, e.Attributes, want)
		}
		for name, w := range want {
			if g := e.Attributes[name]; g.DataType != w.DataType || g.StringValue != w.StringValue {
				t.Errorf("message %d: attribute %s = %+v, want %+v", i, name, g, w)
			}
		}
	}
	for id := range received {
		t.Errorf("the fake received message %s, which is not in the batch", id)
	}
}

func all(int) bool { return true }

func except(skip ...int) func(int) bool {
	return func(i int) bool {
		for _, s := range skip {
			if i == s {
				return false
			}
		}
		return true
	}
}
