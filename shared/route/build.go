package route

import (
	"cmp"
	"errors"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/outbox/headers"
)

// Defaults and the limits the schema cannot express.
const (
	// DefaultTimeout bounds a target call when the route sets no timeout.
	DefaultTimeout = 10 * time.Second
	// DefaultConcurrency is the calls to one target in flight at once when
	// the route sets none.
	DefaultConcurrency = 8
	// MaxTimeout is the longest timeout a route may set: a call that may
	// take longer cannot finish inside a dispatch invocation's lease.
	MaxTimeout = 5 * time.Minute
)

// defaultPayloadBytes is a route's max_payload_bytes by target type when it
// sets none: what SNS and EventBridge accept unless the topic or account is
// configured for more, and 1 MiB for webhooks and Lambda.
var defaultPayloadBytes = map[string]int{
	TypeSNS: 256 << 10, TypeEventBridge: 256 << 10, TypeHTTP: 1 << 20, TypeLambda: 1 << 20,
}

// The defaults of an EventBridge target's templates.
const (
	DefaultSource     = "outbox." + PlaceholderNamespace
	DefaultDetailType = PlaceholderTopic
)

// EventBridge limits on an entry's Source and DetailType (PutEvents).
const (
	maxSourceLen     = 256
	maxDetailTypeLen = 128
)

// build turns a decoded configuration into a Table: the defaults, and the
// checks the schema cannot express, those across fields and routes and
// those that depend on the deployment.
func build(cfg *fileConfig, opts Options, ps *problems) *Table {
	t := &Table{Routes: make([]*Route, 0, len(cfg.Routes))}
	matchedBy := map[Match]int{}
	namedBy := map[string]int{}
	for i := range cfg.Routes {
		rc, p := &cfg.Routes[i], routePath(i)
		r := buildRoute(p, i, rc, opts.attemptCeiling(), ps)
		t.Routes = append(t.Routes, r)
		if !ps.rejectedWithin(p + ".match") {
			if first, dup := matchedBy[r.Match]; dup {
				ps.add(p+".match", "namespace %q and topic %q are already matched by routes[%d]; each pair of patterns may appear once",
					r.Match.Namespace, r.Match.Topic, first)
			} else {
				matchedBy[r.Match] = i
			}
		}
		if rc.Name != "" && !ps.rejectedWithin(p+".name") {
			if first, dup := namedBy[r.Name]; dup {
				ps.add(p+".name", "%q is already the name of routes[%d]; names must be unique", r.Name, first)
			} else {
				namedBy[r.Name] = i
			}
		}
	}
	return t
}

func routePath(i int) string { return "routes[" + strconv.Itoa(i) + "]" }

func buildRoute(p string, i int, rc *routeConfig, attemptCeiling int, ps *problems) *Route {
	tc := &rc.Target
	r := &Route{
		Index:           i,
		Name:            cmp.Or(rc.Name, p),
		Match:           Match{Namespace: rc.Match.Namespace, Topic: rc.Match.Topic},
		Retry:           buildRetry(p+".retry", &rc.Retry, attemptCeiling, ps),
		Timeout:         DefaultTimeout,
		MaxPayloadBytes: cmp.Or(int(rc.MaxPayloadBytes), defaultPayloadBytes[tc.Type]),
		OnDead:          cmp.Or(rc.OnDead, OnDeadSkip),
		OnConfigError:   cmp.Or(rc.OnConfigError, OnConfigErrorHold),
	}
	if tc.Timeout != "" {
		field := p + ".target.timeout"
		d, ok := parseDuration(field, tc.Timeout, ps)
		switch {
		case !ok: // reported
		case d <= 0:
			ps.add(field, "must be positive, got %s", tc.Timeout)
		case d > MaxTimeout:
			ps.add(field, "must be at most %s, got %s", formatDuration(MaxTimeout), tc.Timeout)
		default:
			r.Timeout = d
		}
	}
	r.Target = Target{
		Type:              tc.Type,
		Timeout:           r.Timeout,
		MaxPayloadBytes:   r.MaxPayloadBytes,
		Concurrency:       cmp.Or(int(tc.Concurrency), DefaultConcurrency),
		TopicARN:          tc.TopicARN,
		MessageGroupID:    tc.MessageGroupID,
		EventBus:          tc.EventBus,
		Source:            tc.Source,
		DetailType:        tc.DetailType,
		URL:               tc.URL,
		SigningSecretEnv:  tc.SigningSecretEnv,
		SigningSecretARN:  tc.SigningSecretARN,
		Headers:           tc.Headers,
		AllowInsecureHTTP: tc.AllowInsecureHTTP,
		Function:          tc.Function,
	}
	switch tc.Type {
	case TypeEventBridge:
		r.Target.Source = cmp.Or(tc.Source, DefaultSource)
		r.Target.DetailType = cmp.Or(tc.DetailType, DefaultDetailType)
		checkTemplates(p+".target", r.Target, r.Match, ps)
	case TypeHTTP:
		checkURL(p+".target.url", tc.URL, tc.AllowInsecureHTTP, ps)
		checkHeaders(p+".target.headers", tc.Headers, ps)
	}
	if len(rc.Schema) > 0 && string(rc.Schema) != "null" && !ps.rejectedWithin(p+".schema") {
		sch, canonical, err := compileSchema(rc.Schema, i)
		if err != nil {
			ps.add(p+".schema", "%v", err)
		} else {
			r.schema, r.Schema = sch, canonical
		}
	}
	r.Target.key = r.Target.computeKey()
	return r
}

// buildRetry applies the retry defaults, bounds max_attempts by the attempt
// ceiling, and keeps max_delay at least base_delay.
func buildRetry(p string, rc *retryConfig, attemptCeiling int, ps *problems) backoff.Policy {
	pol := backoff.Default
	if n := rc.MaxAttempts; n > float64(attemptCeiling) {
		ps.add(p+".max_attempts", "must be at most %d (the database's attempt ceiling), got %s",
			attemptCeiling, strconv.FormatFloat(n, 'f', -1, 64))
	} else if n > 0 {
		pol.MaxAttempts = int(n)
	}
	baseOK, maxOK := true, true
	if rc.BaseDelay != "" {
		pol.BaseDelay, baseOK = parseDuration(p+".base_delay", rc.BaseDelay, ps)
	}
	if rc.MaxDelay != "" {
		pol.MaxDelay, maxOK = parseDuration(p+".max_delay", rc.MaxDelay, ps)
	}
	if baseOK && maxOK && !ps.rejectedWithin(p) && pol.MaxDelay < pol.BaseDelay {
		ps.add(p+".max_delay", "is %s%s, less than base_delay %s%s; max_delay must be at least base_delay",
			formatDuration(pol.MaxDelay), defaultNote(rc.MaxDelay), formatDuration(pol.BaseDelay), defaultNote(rc.BaseDelay))
	}
	return pol
}

func defaultNote(set string) string {
	if set == "" {
		return " (the default)"
	}
	return ""
}

// parseDuration reads a duration whose syntax the schema has checked: only
// one too long for a time.Duration (about 290 years) fails.
func parseDuration(field, s string, ps *problems) (time.Duration, bool) {
	d, err := time.ParseDuration(s)
	if err != nil {
		ps.add(field, "%s is too long a duration", truncateQuoted(s))
		return 0, false
	}
	return d, true
}

// formatDuration writes 15m rather than time.Duration's 15m0s.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// checkTemplates checks an EventBridge target's Source and DetailType as
// they expand for the route's names.
func checkTemplates(p string, t Target, m Match, ps *problems) {
	source := expandForCheck(t.Source, m)
	switch {
	case strings.HasPrefix(t.Source, "aws."):
		ps.add(p+".source", "%s starts with \"aws.\": AWS reserves that prefix for its own events", truncateQuoted(t.Source))
	case strings.HasPrefix(source, "aws."):
		ps.add(p+".source", "%s expands to %s for this route, which starts with \"aws.\": AWS reserves that prefix for its own events", truncateQuoted(t.Source), truncateQuoted(source))
	case len(source) > maxSourceLen:
		ps.add(p+".source", "expands to %d characters, over EventBridge's limit of %d", len(source), maxSourceLen)
	}
	if dt := expandForCheck(t.DetailType, m); len(dt) > maxDetailTypeLen {
		ps.add(p+".detail_type", "expands to %d characters, over EventBridge's limit of %d", len(dt), maxDetailTypeLen)
	}
}

// expandForCheck expands a template with the route's exact names, and a
// one-letter stand-in for "*": the shortest a name can be, so that only
// templates that are certainly too long are refused.
func expandForCheck(template string, m Match) string {
	ns, topic := m.Namespace, m.Topic
	if ns == Wildcard || ns == "" {
		ns = "n"
	}
	if topic == Wildcard || topic == "" {
		topic = "t"
	}
	return ExpandTemplate(template, ns, topic)
}

const secretsInline = "secrets are referenced with signing_secret_env or signing_secret_arn, never inline"

// checkHeaders refuses the headers that would carry a credential, that the
// dispatcher sets itself, or that repeat another in a different case; the
// schema has checked their names' and values' characters.
func checkHeaders(p string, headers map[string]string, ps *problems) {
	seen := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(headers)) {
		field, lower := joinPath(p, name), strings.ToLower(name)
		switch {
		case looksLikeSecret(name):
			ps.add(field, "would carry a credential inline; %s", secretsInline)
		case reservedHeader(lower):
			ps.add(field, "is reserved: the dispatcher sets it (Content-Type, Content-Length, Host, Idempotency-Key, User-Agent, webhook-*, X-Amzn-*, Outbox-*, and the hop-by-hop headers are all reserved)")
		case seen[lower] != "":
			ps.add(field, "is the same header as %q (header names are case-insensitive)", seen[lower])
		}
		seen[lower] = name
	}
}

// reservedHeader reports the headers the dispatcher or net/http sets itself:
// the producer-message reserved set (outbox.ReservedHeader, declared in
// package headers) plus the hop-by-hop headers.
func reservedHeader(lower string) bool {
	if headers.Reserved(lower) {
		return true
	}
	switch lower {
	case "te", "trailer", "upgrade", "keep-alive", "proxy-connection", "expect":
		return true
	}
	return false
}

// checkURL checks a webhook URL. It never quotes the URL: webhook URLs
// often carry a token in their path or query.
func checkURL(field, raw string, allowInsecure bool, ps *problems) {
	u, err := url.Parse(raw)
	if err != nil {
		// The url.Error's own text repeats the URL, which may hold a secret.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		ps.add(field, "is not a URL: %v", err)
		return
	}
	if u.User != nil {
		ps.add(field, "contains credentials (user:password@); %s", secretsInline)
		return
	}
	if !u.IsAbs() || u.Host == "" {
		ps.add(field, "is not an absolute URL such as https://billing.internal/usage")
		return
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !allowInsecure && !isLoopback(u.Hostname()) {
			ps.add(field, "uses http:// to %s, which sends messages unencrypted; use https://, or set allow_insecure_http: true on a network you trust", u.Hostname())
		}
	default:
		ps.add(field, "has scheme %q; use https:// (or http:// to localhost)", u.Scheme)
	}
	for _, name := range slices.Sorted(maps.Keys(u.Query())) {
		if looksLikeSecret(name) {
			ps.add(field, "has the query parameter %q, which would carry a credential inline; %s", name, secretsInline)
		}
	}
	if u.Fragment != "" {
		ps.add(field, "has a #fragment, which is never sent; remove it")
	}
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// article is the indefinite article of a target type as it is spoken:
// an SNS, an EventBridge, an HTTP, a Lambda target.
func article(targetType string) string {
	if targetType == TypeLambda {
		return "a"
	}
	return "an"
}

// looksLikeSecret reports whether a field, header or query parameter name
// suggests that a credential is being written into the configuration,
// which is readable by anyone who can read the function's configuration.
func looksLikeSecret(name string) bool {
	n := strings.NewReplacer("_", "", "-", "", ".", "", " ", "").Replace(strings.ToLower(name))
	for _, s := range []string{"secret", "password", "passwd", "token", "apikey", "credential", "privatekey", "accesskey", "authorization", "bearer", "cookie"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}
