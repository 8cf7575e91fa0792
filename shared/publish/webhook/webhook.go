package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/outboxkit/dispatcher/shared/outbox/headers"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
)

// Defaults of the Config fields left zero.
const (
	DefaultTimeout         = 10 * time.Second
	DefaultMaxPayloadBytes = 1 << 20
	DefaultConcurrency     = 8
	DefaultUserAgent       = "outbox-dispatcher"
)

// HeaderPayloadOffloaded ("s3") is sent with a message whose payload a
// route offloaded to S3: the envelope's payload is null and its offload
// field says where the payload is.
const HeaderPayloadOffloaded = "Outbox-Payload-Offloaded"

// Config is one webhook target.
type Config struct {
	// URL is the endpoint; required, absolute http or https.
	URL string
	// Secret is the Standard Webhooks signing secret, raw bytes (see
	// ParseSecret and ResolveSecret); required.
	Secret []byte
	// Timeout bounds each request, from sending to reading the answer
	// (default DefaultTimeout).
	Timeout time.Duration
	// MaxPayloadBytes caps the request body, the envelope (default
	// DefaultMaxPayloadBytes).
	MaxPayloadBytes int
	// Headers are static extra headers sent on every request; they may not
	// name a header the publisher sets itself (see the package doc).
	Headers map[string]string
	// Concurrency is the number of requests in flight per Publish call
	// (default DefaultConcurrency). The client New builds also opens at
	// most this many connections to the target: concurrent Publish calls
	// on one Publisher share them, waiting (within their timeout) for one.
	Concurrency int
	// UserAgent is the User-Agent header (default DefaultUserAgent).
	UserAgent string
	// CloudEvents, when set, sends each message as a CloudEvent in binary
	// mode instead of the envelope (route format cloudevents): the body is
	// the payload as it is, the attributes ce-* headers.
	CloudEvents *cloudevent.Encoder
}

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.UserAgent = cmp.Or(c.UserAgent, DefaultUserAgent)
	return c
}

// validate checks c (with defaults) and returns its parsed URL.
func (c Config) validate() (*url.URL, error) {
	if c.URL == "" {
		return nil, errors.New("webhook: url is required")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		// url.Error repeats the URL, which may hold credentials.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("webhook: url is not a valid URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("webhook: url must be an absolute http or https URL, got %q", u.Redacted())
	}
	switch {
	case len(c.Secret) == 0:
		return nil, errors.New("webhook: secret is required (the Standard Webhooks signing secret)")
	case c.Timeout < 0:
		return nil, fmt.Errorf("webhook: timeout must be positive, got %s", c.Timeout)
	case c.MaxPayloadBytes < 0:
		return nil, fmt.Errorf("webhook: max_payload_bytes must be positive, got %d", c.MaxPayloadBytes)
	case c.Concurrency < 0:
		return nil, fmt.Errorf("webhook: concurrency must be positive, got %d", c.Concurrency)
	case !validHeaderValue(c.UserAgent):
		return nil, fmt.Errorf("webhook: user_agent %q is not a valid header value", c.UserAgent)
	}
	for name, value := range c.Headers {
		switch {
		case !validHeaderName(name):
			return nil, fmt.Errorf("webhook: headers: %q is not a valid header name", name)
		case !validHeaderValue(value):
			return nil, fmt.Errorf("webhook: headers: the value of %s is not a valid header value", name)
		case reservedHeaders[http.CanonicalHeaderKey(name)]:
			return nil, fmt.Errorf("webhook: headers: %s is set by the publisher and cannot be configured", name)
		}
	}
	return u, nil
}

// Publisher delivers messages to one webhook URL. It is safe for concurrent
// use; build one per target, once per cold start.
type Publisher struct {
	client    *http.Client
	url       *url.URL
	target    string // the URL without credentials or query, for errors
	signer    *signer
	staticHdr http.Header // Content-Type, User-Agent, Config.Headers
	timeout   time.Duration
	maxBody   int
	now       func() time.Time
	events    *cloudevent.Encoder
	batcher   publish.Batcher[[]byte]
}

var _ publish.Publisher = (*Publisher)(nil)

// New builds a Publisher for cfg. A nil client gets one built for this
// target (see NewHTTPClient); a given client is used as it is, except that
// redirects are never followed.
func New(client *http.Client, cfg Config) (*Publisher, error) {
	cfg = cfg.withDefaults()
	u, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	if client == nil {
		client = NewHTTPClient(cfg.Concurrency)
	} else {
		c := *client // a shallow copy shares the transport and its pool
		c.CheckRedirect = noRedirects
		client = &c
	}
	signer := newSigner(cfg.Secret)
	static := make(http.Header, len(cfg.Headers)+2)
	for name, value := range cfg.Headers {
		static.Set(name, value)
	}
	static.Set("Content-Type", "application/json")
	static.Set("User-Agent", cfg.UserAgent)

	target := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	p := &Publisher{
		client:    client,
		url:       u,
		target:    target.String(),
		signer:    signer,
		staticHdr: static,
		timeout:   cfg.Timeout,
		maxBody:   cfg.MaxPayloadBytes,
		now:       time.Now,
		events:    cfg.CloudEvents,
	}
	prepare := publish.PrepareEnvelope("webhook", p.maxBody)
	if p.events != nil {
		prepare = publish.PrepareBody("webhook", "CloudEvent", p.maxBody, func(m *outboxtype.Message) ([]byte, error) {
			return m.Payload, p.events.Check(m) // checked here, so that the headers cannot fail when sending
		})
	}
	p.batcher = publish.Batcher[[]byte]{MaxEntries: 1, Concurrency: cfg.Concurrency, Prepare: prepare, Call: p.post}
	return p, nil
}

// NewHTTPClient is the client New builds when given none: keep-alive with
// concurrency idle connections to the target and at most that many open (so
// that bursts reuse connections instead of opening more), TLS 1.2 or newer,
// HTTP/2 where the target offers it, no redirects followed, and no overall
// client timeout (each request carries its own).
func NewHTTPClient(concurrency int) *http.Client {
	if concurrency <= 0 {
		concurrency = DefaultConcurrency
	}
	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   5 * time.Second,
		MaxIdleConns:          concurrency,
		MaxIdleConnsPerHost:   concurrency,
		MaxConnsPerHost:       concurrency,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		WriteBufferSize:       writeBufferBytes,
	}
	return &http.Client{Transport: transport, CheckRedirect: noRedirects}
}

// writeBufferBytes is each connection's write buffer: a request up to this
// size, headers and body, goes out in one write. With net/http's 4 KiB a
// body past about 3.5 KiB took two, each a system call and a TCP segment
// out of the function's CPU share.
const writeBufferBytes = 64 << 10

// noRedirects hands a 3xx back to the publisher, which makes it terminal.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Publish POSTs each message, up to Concurrency at once, each ordering
// key's one after another in sequence order (see publish.Publisher), and
// returns one result per message, in order.
func (p *Publisher) Publish(ctx context.Context, msgs []*outboxtype.Message) []publish.Result {
	return p.batcher.Publish(ctx, msgs)
}

// Bounds on reading an answer: the head is kept for the error, the rest is
// read and dropped so the connection can be reused; a body longer than that
// costs the connection rather than the time to read it.
const (
	snippetBytes = 512
	drainBytes   = 64 << 10
)

// post is the Batcher's call: one request, one message.
func (p *Publisher) post(ctx context.Context, msgs []*outboxtype.Message, bodies [][]byte, results []publish.Result) bool {
	results[0] = p.postOne(ctx, msgs[0], bodies[0])
	return false
}

// postOne signs and POSTs one body. It signs at sending time, not at
// encoding time, so the timestamp a receiver checks for freshness is the
// request's own.
func (p *Publisher) postOne(ctx context.Context, m *outboxtype.Message, body []byte) publish.Result {
	key := m.StableKey()
	sentAt := p.now()
	signature := p.signer.Sign(key, sentAt, body)
	header := p.header(m, key, sentAt, signature)

	reqCtx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.client.Do(p.request(reqCtx, body, header))
	if err != nil {
		return p.classifyTransportError(ctx, err)
	}
	var head []byte
	truncated := false
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		head, truncated = readHead(resp.Body)
	}
	drain(resp.Body)
	return classifyResponse(resp.StatusCode, resp.Header, head, truncated, p.now())
}

// header is a request's header: the message's own headers, then the static
// ones over them, then the protocol's over everything.
func (p *Publisher) header(m *outboxtype.Message, key string, sentAt time.Time, signature string) http.Header {
	protocol := 6
	if p.events != nil {
		protocol += 8 // the ce-* headers
	}
	h := make(http.Header, len(m.Headers)+len(p.staticHdr)+protocol)
	for name, value := range m.Headers {
		if !validHeaderName(name) || !validHeaderValue(value) {
			continue // carried in the envelope only
		}
		name = http.CanonicalHeaderKey(name)
		// A row enqueued before the producer rules refused a name (or
		// written by hand) must not put it on the wire either: the
		// signature does not cover headers, only the body's copy.
		if reservedHeaders[name] || headers.Reserved(name) {
			continue
		}
		h[name] = []string{value}
	}
	for name, values := range p.staticHdr {
		h[name] = values // shared, read-only
	}
	h["Webhook-Id"] = []string{key}
	h["Webhook-Timestamp"] = []string{strconv.FormatInt(sentAt.Unix(), 10)}
	h["Webhook-Signature"] = []string{signature}
	h["Idempotency-Key"] = []string{key}
	if p.events != nil {
		_ = p.events.SetBinaryHeaders(h, m) // Prepare checked the message
	}
	if m.Offload != nil {
		// Marks a body whose payload is in S3 (envelope field offload), so
		// that a receiver can tell before parsing it.
		h[HeaderPayloadOffloaded] = []string{"s3"}
	}
	if m.TraceHeader != "" && validHeaderValue(m.TraceHeader) {
		h["X-Amzn-Trace-Id"] = []string{m.TraceHeader}
	}
	return h
}

// request builds the POST from the URL parsed once by New. GetBody lets the
// transport replay the body on a fresh connection when a pooled one turns
// out closed; with the Idempotency-Key header that makes the POST replayable
// in net/http's eyes.
func (p *Publisher) request(ctx context.Context, body []byte, header http.Header) *http.Request {
	u := *p.url
	req := &http.Request{
		Method:        http.MethodPost,
		URL:           &u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        header,
		Host:          u.Host,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		GetBody: func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(body)), nil
		},
	}
	return req.WithContext(ctx)
}

// readHead reads the first snippetBytes of an answer's body, and whether
// there was more.
func readHead(body io.Reader) ([]byte, bool) {
	buf := make([]byte, snippetBytes+1)
	n, _ := io.ReadFull(body, buf)
	if n > snippetBytes {
		return buf[:snippetBytes], true
	}
	return buf[:n], false
}

// drain reads what is left of a body, up to drainBytes, and closes it: a
// body read to its end lets the transport reuse the connection.
func drain(body io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, body, drainBytes)
	_ = body.Close()
}

// reservedHeaders are the headers the publisher or the transport owns: the
// protocol's, and the hop-by-hop ones that would change how the request
// travels rather than what it says.
var reservedHeaders = map[string]bool{
	"Content-Type":        true,
	"Content-Length":      true,
	"Content-Encoding":    true,
	"Transfer-Encoding":   true,
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Connection":    true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Upgrade":             true,
	"Host":                true,
	"Expect":              true,
	"User-Agent":          true,
	"Webhook-Id":          true,
	"Webhook-Timestamp":   true,
	"Webhook-Signature":   true,
	"Idempotency-Key":     true,
	"X-Amzn-Trace-Id":     true,
}

// validHeaderName reports whether s is an HTTP token (RFC 9110, section 5.1).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 || !isTokenChar[c] {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether s may be sent as a field value: no
// control characters but horizontal tab (RFC 9110, section 5.5).
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

var isTokenChar = func() (t [128]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// errorf prefixes an error with the target as errors name it: without
// credentials or query, where tokens tend to live.
func (p *Publisher) errorf(format string, args ...any) error {
	return fmt.Errorf("webhook: POST "+p.target+": "+format, args...)
}
