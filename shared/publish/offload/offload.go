// Package offload is the claim-check for payloads too large for their
// target: a [Publisher] wraps a route's publisher, writes each payload over
// the route's threshold to S3 and hands the target a pointer to it instead.
//
// What the target receives depends on its type (see docs/DEPLOYING.md):
//
//   - SNS: the AWS payload-offloading format, which the SNS and SQS Extended
//     Client Libraries read unchanged: the body
//     ["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":…,"s3Key":…}]
//     and the Number attribute ExtendedPayloadSize (set by the sns package
//     from Message.Offload).
//   - EventBridge: Detail must be a JSON object, so the same pointer as an
//     object: {"software.amazon.payloadoffloading.PayloadS3Pointer":
//     {"s3BucketName":…,"s3Key":…},"ExtendedPayloadSize":N}.
//   - Webhooks and Lambda functions: the envelope, its payload null and its
//     offload field holding the bucket, key, size and a presigned GET URL.
//
// The object key is the prefix and the message id, which every attempt and
// replay of a message shares: a retry rewrites the same object, so a
// message leaves one object behind however often it is sent.
package offload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/awserr"
	"github.com/outboxkit/dispatcher/shared/route"
)

// Defaults of the route option's fields left out, and the longest URL TTL.
const (
	DefaultThresholdBytes = 245760 // 240 KiB: leaves 16 KiB of a 256 KiB SNS message for its attributes
	DefaultPrefix         = "outbox/"
	DefaultURLTTL         = time.Hour
	MaxURLTTL             = 12 * time.Hour
)

// PointerClass is the class name the payload-offloading libraries write
// before the pointer (Jackson's type wrapper), and read back.
const PointerClass = "software.amazon.payloadoffloading.PayloadS3Pointer"

// Config is one route's offload.
type Config struct {
	Bucket string
	// ThresholdBytes: a payload larger than this is offloaded.
	ThresholdBytes int
	Prefix         string
	// KMSKeyID, when set, encrypts objects with SSE-KMS; else SSE-S3.
	KMSKeyID string
	// URLTTL is the presigned URL's validity (webhook and Lambda targets).
	URLTTL time.Duration
	// TargetType is the route's target type: it decides the pointer.
	TargetType string
	// TargetMaxBytes is the most the wrapped publisher sends; the
	// threshold must not exceed it.
	TargetMaxBytes int
	// Timeout bounds each PutObject; Concurrency the PutObjects in flight.
	Timeout     time.Duration
	Concurrency int
}

// FromRoute returns the Config of a route's offload option, its defaults
// applied, and false when the route has none.
func FromRoute(t route.Target, targetMaxBytes int) (Config, bool, error) {
	o := t.Offload
	if o == (route.Offload{}) {
		return Config{}, false, nil
	}
	c := Config{Bucket: o.Bucket, ThresholdBytes: int(o.ThresholdBytes), Prefix: o.Prefix, KMSKeyID: o.KMSKeyID,
		TargetType: t.Type, TargetMaxBytes: targetMaxBytes, Timeout: t.Timeout, Concurrency: t.Concurrency}
	if c.ThresholdBytes == 0 {
		c.ThresholdBytes = DefaultThresholdBytes
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	c.URLTTL = DefaultURLTTL
	if o.URLTTL != "" {
		d, err := time.ParseDuration(o.URLTTL)
		if err != nil {
			return Config{}, true, fmt.Errorf("offload.url_ttl: %v", err)
		}
		c.URLTTL = d
	}
	return c, true, c.validate()
}

func (c Config) validate() error {
	switch {
	case c.Bucket == "":
		return errors.New("offload.bucket is required")
	case c.ThresholdBytes < 1 || (c.TargetMaxBytes > 0 && c.ThresholdBytes > c.TargetMaxBytes):
		return fmt.Errorf("offload.threshold_bytes must be from 1 to %d (what a %s target takes inline), got %d", c.TargetMaxBytes, c.TargetType, c.ThresholdBytes)
	case c.URLTTL <= 0 || c.URLTTL > MaxURLTTL:
		return fmt.Errorf("offload.url_ttl must be more than 0 and at most %s, got %s", MaxURLTTL, c.URLTTL)
	}
	switch c.TargetType {
	case route.TypeSNS, route.TypeEventBridge, route.TypeHTTP, route.TypeLambda:
	default:
		return fmt.Errorf("offload: unknown target type %q", c.TargetType)
	}
	return nil
}

// Key is the object key of a message's payload: the same on every attempt.
func (c Config) Key(m *outboxtype.Message) string { return c.Prefix + m.ID.String() + ".json" }

// Publisher offloads the large payloads of a batch, then hands the batch to
// the target's publisher.
type Publisher struct {
	inner   publish.Publisher
	client  *s3.Client
	presign *s3.PresignClient
	cfg     Config
	now     func() time.Time
}

// New wraps inner. client is the cold start's S3 client, shared by every
// route that offloads.
func New(inner publish.Publisher, client *s3.Client, cfg Config) (*Publisher, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Concurrency = max(cfg.Concurrency, 1)
	if cfg.Timeout <= 0 {
		cfg.Timeout = route.DefaultTimeout
	}
	p := &Publisher{inner: inner, client: client, cfg: cfg, now: time.Now}
	if cfg.TargetType == route.TypeHTTP || cfg.TargetType == route.TypeLambda {
		p.presign = s3.NewPresignClient(client)
	}
	return p, nil
}

// lane is an ordering key's identity within a batch.
type lane struct{ namespace, key string }

// Publish writes the payloads over the threshold to S3, concurrently, then
// publishes the batch with those payloads replaced by pointers. A message
// whose object could not be written is not sent (its result is the
// PutObject's), nor are the later messages of its ordering key, which come
// back Released; the rest of the batch goes on.
func (p *Publisher) Publish(ctx context.Context, msgs []*outboxtype.Message) []publish.Result {
	var big []int
	for i, m := range msgs {
		if len(m.Payload) > p.cfg.ThresholdBytes {
			big = append(big, i)
		}
	}
	if len(big) == 0 {
		return p.inner.Publish(ctx, msgs)
	}

	results := make([]publish.Result, len(msgs))
	sent := make([]*outboxtype.Message, len(msgs))
	copy(sent, msgs)
	failed := make([]bool, len(msgs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, p.cfg.Concurrency)
	for _, i := range big {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			m, r, ok := p.offload(ctx, msgs[i])
			if ok {
				sent[i] = m
			} else {
				results[i], failed[i] = r, true
			}
		}()
	}
	wg.Wait()

	// A lane stops at its first message not written: the lane's messages
	// after it (by sequence) are not sent.
	firstFailed := map[lane]int64{}
	for i, m := range msgs {
		if failed[i] && m.OrderingKey != "" {
			l := lane{m.Namespace, m.OrderingKey}
			if s, ok := firstFailed[l]; !ok || m.SequenceID < s {
				firstFailed[l] = m.SequenceID
			}
		}
	}
	var idx []int
	var forward []*outboxtype.Message
	for i, m := range msgs {
		if failed[i] {
			continue
		}
		if s, ok := firstFailed[lane{m.Namespace, m.OrderingKey}]; ok && m.OrderingKey != "" && m.SequenceID > s {
			results[i] = publish.Result{Kind: publish.Released, Err: publish.ErrEarlierNotDelivered}
			continue
		}
		idx, forward = append(idx, i), append(forward, sent[i])
	}
	if len(forward) > 0 {
		inner := p.inner.Publish(ctx, forward)
		// A lane whose earlier message the target did not take: its failed
		// write is behind that message, so it is Released, not an attempt.
		stopped := map[lane]int64{}
		for j, i := range idx {
			if m := msgs[i]; m.OrderingKey != "" && inner[j].Kind != publish.Delivered {
				l := lane{m.Namespace, m.OrderingKey}
				if s, ok := stopped[l]; !ok || m.SequenceID < s {
					stopped[l] = m.SequenceID
				}
			}
			results[i] = inner[j]
		}
		for i, m := range msgs {
			if s, ok := stopped[lane{m.Namespace, m.OrderingKey}]; ok && failed[i] && m.OrderingKey != "" && m.SequenceID > s {
				results[i] = publish.Result{Kind: publish.Released, Err: publish.ErrEarlierNotDelivered}
			}
		}
	}
	return results
}

// offload writes m's payload and returns the message to send in its place.
func (p *Publisher) offload(ctx context.Context, m *outboxtype.Message) (*outboxtype.Message, publish.Result, bool) {
	if ctx.Err() != nil {
		r, _ := publish.ContextResult(ctx, ctx.Err())
		return nil, r, false
	}
	key := p.cfg.Key(m)
	in := &s3.PutObjectInput{
		Bucket: aws.String(p.cfg.Bucket), Key: aws.String(key), Body: bytes.NewReader(m.Payload),
		ContentLength: aws.Int64(int64(len(m.Payload))), ContentType: aws.String("application/json"),
		ServerSideEncryption: s3types.ServerSideEncryptionAes256,
	}
	if p.cfg.KMSKeyID != "" {
		in.ServerSideEncryption, in.SSEKMSKeyId = s3types.ServerSideEncryptionAwsKms, aws.String(p.cfg.KMSKeyID)
	}
	callCtx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	start := time.Now()
	_, err := p.client.PutObject(callCtx, in)
	cancel()
	if err != nil {
		r := classify(ctx, err)
		r.Latency = time.Since(start)
		return nil, r, false
	}

	o := &outboxtype.Offload{Bucket: p.cfg.Bucket, Key: key, Size: len(m.Payload)}
	out := *m
	out.Offload = o
	switch p.cfg.TargetType {
	case route.TypeSNS:
		out.Payload = snsPointer(o)
	case route.TypeEventBridge:
		out.Payload = eventBridgePointer(o)
	default:
		// Presigning signs locally: no call, no latency. The clock is read
		// first, so that the expiry given is never later than the URL's.
		signedAt := p.now().UTC().Truncate(time.Second)
		req, err := p.presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(p.cfg.Bucket), Key: aws.String(key)},
			s3.WithPresignExpires(p.cfg.URLTTL))
		if err != nil {
			return nil, classify(ctx, err), false
		}
		o.URL, o.URLExpires = req.URL, signedAt.Add(p.cfg.URLTTL)
		out.Payload = nil // the envelope's payload is null; its offload field points at the object
	}
	return &out, publish.Result{}, true
}

type s3Pointer struct {
	Bucket string `json:"s3BucketName"`
	Key    string `json:"s3Key"`
}

// snsPointer is the payload-offloading libraries' body: their
// PayloadS3Pointer as Jackson writes it with its class name.
func snsPointer(o *outboxtype.Offload) json.RawMessage {
	b, _ := json.Marshal([]any{PointerClass, s3Pointer{o.Bucket, o.Key}}) // two strings always marshal
	return b
}

// eventBridgePointer is the same pointer as a JSON object, which EventBridge
// Detail must be, with the size that SNS carries as an attribute.
func eventBridgePointer(o *outboxtype.Offload) json.RawMessage {
	b, _ := json.Marshal(map[string]any{PointerClass: s3Pointer{o.Bucket, o.Key}, "ExtendedPayloadSize": o.Size})
	return b
}

// classify turns a PutObject error into a Result: a configuration failure
// (credentials, the bucket policy, a KMS key, a missing bucket) is terminal
// ACCESS_DENIED or TARGET_NOT_FOUND, for the route's on_config_error to
// hold; the rest is retried.
func classify(ctx context.Context, err error) publish.Result {
	err = fmt.Errorf("offload: writing the payload to S3: %w", err)
	if r, ok := publish.ContextResult(ctx, err); ok {
		return r
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "NoSuchBucket":
			return publish.Fail(outboxtype.CodeTargetNotFound, err)
		case "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccountProblem",
			"KMS.AccessDeniedException", "KMS.NotFoundException", "KMS.DisabledException", "KMS.KMSInvalidStateException":
			return publish.Fail(outboxtype.CodeAccessDenied, err)
		case "ExpiredToken", "TokenRefreshRequired", "RequestTimeTooSkewed":
			return publish.Retry(outboxtype.CodeAccessDenied, err, 0)
		case "SlowDown", "RequestLimitExceeded", "Throttling", "ThrottlingException":
			return publish.Retry(outboxtype.CodeThrottled, err, 0)
		}
	}
	var resp *smithyhttp.ResponseError
	if errors.As(err, &resp) {
		switch status := resp.HTTPStatusCode(); {
		case status == http.StatusForbidden || status == http.StatusUnauthorized:
			return publish.Fail(outboxtype.CodeAccessDenied, err)
		case status == http.StatusNotFound:
			return publish.Fail(outboxtype.CodeTargetNotFound, err)
		case status == http.StatusTooManyRequests:
			return publish.Retry(outboxtype.CodeThrottled, err, 0)
		case status >= 500:
			return publish.Retry(outboxtype.CodeTarget5xx, err, 0)
		default:
			// Another 4xx is S3 refusing this request, which would refuse
			// every retry alike: a configuration to fix, held like one.
			return publish.Fail(outboxtype.CodeAccessDenied, fmt.Errorf("%w (HTTP %s)", err, strconv.Itoa(status)))
		}
	}
	// Checked after the answer: S3's response error unwraps past the
	// SDK's HTTP response error, which awserr takes as the sign of a sent
	// request.
	if awserr.CredentialsUnavailable(err) {
		return publish.Retry(outboxtype.CodeAccessDenied, err, 0)
	}
	return publish.Retry(outboxtype.CodeNetwork, err, 0)
}
