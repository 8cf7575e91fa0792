package route

import (
	"cmp"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/outbox/headers"
	"github.com/outboxkit/dispatcher/shared/payloadschema"
	"github.com/outboxkit/dispatcher/shared/publish/cloudevent"
)

// The schema's defaults (tests keep them equal), and the limits it cannot
// express: MaxTimeout, as a longer call could not finish inside a dispatch
// invocation's lease, and EventBridge's on an entry's Source and DetailType.
const (
	DefaultTimeout                 = 10 * time.Second
	DefaultConcurrency             = 8
	DefaultSource                  = "outbox." + PlaceholderNamespace
	DefaultDetailType              = PlaceholderTopic
	MaxTimeout                     = 5 * time.Minute
	maxSourceLen, maxDetailTypeLen = 256, 128
)

// defaultPayloadBytes are the schema's max_payload_bytes defaults by type.
var defaultPayloadBytes = map[string]int{TypeSNS: 256 << 10, TypeEventBridge: 256 << 10, TypeHTTP: 1 << 20, TypeLambda: 1 << 20}

const secretsInline = "secrets are referenced with signing_secret_env or signing_secret_arn, never inline"

// build applies the defaults and makes the checks a schema cannot.
func build(cfg *fileConfig, attemptCeiling int, ps *problems) *Table {
	t := &Table{Routes: make([]*Route, 0, len(cfg.Routes))}
	byMatch, byName := map[Match]*Route{}, map[string]*Route{}
	for i := range cfg.Routes {
		p := "routes[" + strconv.Itoa(i) + "]"
		r := buildRoute(p, i, &cfg.Routes[i], attemptCeiling, ps)
		t.Routes = append(t.Routes, r)
		// Not in the schema: uniqueItems compares whole routes, not a field.
		// (An unnamed route's name, routes[<index>], is no valid name.)
		if first := byMatch[r.Match]; first == nil {
			byMatch[r.Match] = r
		} else if !ps.rejectedWithin(p + ".match") {
			ps.add(p+".match", "namespace %q and topic %q are already matched by routes[%d]; each pair of patterns may appear once",
				r.Match.Namespace, r.Match.Topic, first.Index)
		}
		if first := byName[r.Name]; first == nil {
			byName[r.Name] = r
		} else if !ps.rejectedWithin(p + ".name") {
			ps.add(p+".name", "%q is already the name of routes[%d]; names must be unique", r.Name, first.Index)
		}
	}
	t.index()
	return t
}

func buildRoute(p string, i int, rc *routeConfig, attemptCeiling int, ps *problems) *Route {
	r, tc := &rc.Route, &rc.Target
	r.Index, r.Name = i, cmp.Or(r.Name, p)
	r.OnDead, r.OnConfigError = cmp.Or(r.OnDead, OnDeadSkip), cmp.Or(r.OnConfigError, OnConfigErrorHold)
	r.Retry = buildRetry(p+".retry", &rc.Retry, attemptCeiling, ps)
	r.MaxPayloadBytes = cmp.Or(int(rc.MaxPayloadBytes), defaultPayloadBytes[tc.Type])
	// Not in the schema: a pattern says how a duration looks, not how long.
	if r.Timeout, _ = parseDuration(p+".target.timeout", tc.Timeout, DefaultTimeout, ps); r.Timeout <= 0 {
		ps.add(p+".target.timeout", "must be positive, got %s", tc.Timeout)
	} else if r.Timeout > MaxTimeout {
		ps.add(p+".target.timeout", "must be at most %s, got %s", formatDuration(MaxTimeout), tc.Timeout)
	}
	r.Target = tc.Target
	r.Target.Timeout, r.Target.MaxPayloadBytes, r.Target.Concurrency, r.Target.Offload = r.Timeout, r.MaxPayloadBytes, cmp.Or(int(tc.Concurrency), DefaultConcurrency), rc.Offload
	r.Target.Format, r.Target.CloudEventsSource = rc.Format, rc.CloudEvents.Source
	checkFormat(p, rc, ps)
	switch tc.Type {
	case TypeEventBridge:
		r.Target.Source = cmp.Or(r.Target.Source, DefaultSource)
		r.Target.DetailType = cmp.Or(r.Target.DetailType, DefaultDetailType)
		checkTemplates(p+".target", r.Target, r.Match, ps)
	case TypeHTTP:
		checkURL(p+".target.url", r.Target.URL, r.Target.AllowInsecureHTTP, ps)
		checkHeaders(p+".target.headers", r.Target.Headers, ps)
	}
	// Not in the schema: a payload schema is checked against its own draft's
	// metaschema, and its $refs resolved, by compiling it.
	if len(r.Schema) > 0 && !ps.rejectedWithin(p+".schema") {
		var err error
		if r.schema, err = payloadschema.Compile(r.Schema, i); err != nil {
			ps.add(p+".schema", "%v", err)
		}
	}
	r.Target.key = r.Target.computeKey()
	return r
}

// buildRetry applies the retry defaults. Not in the schema: the attempt
// ceiling is the deployment's, and max_delay >= base_delay compares two
// fields.
func buildRetry(p string, rc *retryConfig, attemptCeiling int, ps *problems) backoff.Policy {
	pol := backoff.Default
	if n := rc.MaxAttempts; n > float64(attemptCeiling) {
		ps.add(p+".max_attempts", "must be at most %d (the database's attempt ceiling), got %s",
			attemptCeiling, strconv.FormatFloat(n, 'f', -1, 64))
	} else if n > 0 {
		pol.MaxAttempts = int(n)
	}
	var baseOK, maxOK bool
	pol.BaseDelay, baseOK = parseDuration(p+".base_delay", rc.BaseDelay, pol.BaseDelay, ps)
	pol.MaxDelay, maxOK = parseDuration(p+".max_delay", rc.MaxDelay, pol.MaxDelay, ps)
	if note := map[bool]string{true: " (the default)"}; baseOK && maxOK && !ps.rejectedWithin(p) && pol.MaxDelay < pol.BaseDelay {
		ps.add(p+".max_delay", "is %s%s, less than base_delay %s%s; max_delay must be at least base_delay",
			formatDuration(pol.MaxDelay), note[rc.MaxDelay == ""], formatDuration(pol.BaseDelay), note[rc.BaseDelay == ""])
	}
	return pol
}

// parseDuration reads a duration, def when it is not set. The schema has
// checked its syntax: only one over time.Duration's 290 years fails.
func parseDuration(field, s string, def time.Duration, ps *problems) (time.Duration, bool) {
	if s == "" {
		return def, true
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		ps.add(field, "%s is too long a duration", truncateQuoted(s))
		return def, false
	}
	return d, true
}

// formatDuration writes 15m and 1h rather than 15m0s and 1h0m0s.
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

// checkTemplates checks an EventBridge target's templates expanded for the
// route's names, a "*" as a one-letter name (the shortest). Not in the
// schema: the expansion takes the route's match, another field.
func checkTemplates(p string, t Target, m Match, ps *problems) {
	ns, topic := m.Namespace, m.Topic
	if ns == Wildcard || ns == "" {
		ns = "n"
	}
	if topic == Wildcard || topic == "" {
		topic = "t"
	}
	switch source := ExpandTemplate(t.Source, ns, topic); {
	case strings.HasPrefix(t.Source, "aws."):
		ps.add(p+".source", "%s starts with \"aws.\": AWS reserves that prefix for its own events", truncateQuoted(t.Source))
	case strings.HasPrefix(source, "aws."):
		ps.add(p+".source", "%s expands to %s for this route, which starts with \"aws.\": AWS reserves that prefix for its own events", truncateQuoted(t.Source), truncateQuoted(source))
	case len(source) > maxSourceLen:
		ps.add(p+".source", "expands to %d characters, over EventBridge's limit of %d", len(source), maxSourceLen)
	}
	if dt := ExpandTemplate(t.DetailType, ns, topic); len(dt) > maxDetailTypeLen {
		ps.add(p+".detail_type", "expands to %d characters, over EventBridge's limit of %d", len(dt), maxDetailTypeLen)
	}
}

// checkFormat makes the format's checks a schema cannot: the options of
// one format on a route of another, the source expanded, and offload,
// whose pointers have no CloudEvents form the targets' readers share.
func checkFormat(p string, rc *routeConfig, ps *problems) {
	switch {
	case rc.Format == "" && rc.CloudEvents.Source != "":
		ps.add(p+".cloudevents", "is set but format is not \"cloudevents\"; set format: cloudevents, or remove it")
	case rc.Format == FormatCloudEvents && rc.Offload != (Offload{}):
		ps.add(p+".format", "cloudevents cannot be combined with offload: an offloaded payload has no CloudEvents form here; remove one of them")
	case rc.CloudEvents.Source != "" && !ps.rejectedWithin(p+".cloudevents"):
		if err := cloudevent.CheckSource(rc.CloudEvents.Source); err != nil {
			ps.add(p+".cloudevents.source", "%v", err)
		}
	}
}

// checkHeaders refuses the headers that would carry a credential, that the
// dispatcher or net/http sets (package headers' reserved set, hop-by-hop
// headers), or that repeat another. Not in the schema: header names compare
// without case, which a portable (ECMA-262) pattern cannot say.
func checkHeaders(p string, hs map[string]string, ps *problems) {
	seen := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(hs)) {
		field, lower := joinPath(p, name), strings.ToLower(name)
		switch {
		case looksLikeSecret(name):
			ps.add(field, "would carry a credential inline; %s", secretsInline)
		case headers.Reserved(lower) || slices.Contains([]string{"te", "trailer", "upgrade", "keep-alive", "proxy-connection", "expect"}, lower):
			ps.add(field, "is reserved: the dispatcher sets it (Content-Type, Content-Length, Host, Idempotency-Key, User-Agent, webhook-*, ce-*, X-Amzn-*, Outbox-*, and the hop-by-hop headers are all reserved)")
		case seen[lower] != "":
			ps.add(field, "is the same header as %q (header names are case-insensitive)", seen[lower])
		}
		seen[lower] = name
	}
}

// checkURL checks a webhook URL, never quoting it (webhook URLs often carry
// a token). Not in the schema: judging a host and a query takes parsing the
// URL, and http:// depends on allow_insecure_http.
func checkURL(field, raw string, allowInsecure bool, ps *problems) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		ps.add(field, "is not a URL: %v", err.(*url.Error).Err) // the url.Error's own text repeats the URL
		return
	case u.User != nil:
		ps.add(field, "contains credentials (user:password@); %s", secretsInline)
		return
	case !u.IsAbs() || u.Host == "":
		ps.add(field, "is not an absolute URL such as https://billing.internal/usage")
		return
	case u.Scheme == "http" && !allowInsecure && !strings.EqualFold(u.Hostname(), "localhost") && !net.ParseIP(u.Hostname()).IsLoopback():
		ps.add(field, "uses http:// to %s, which sends messages unencrypted; use https://, or set allow_insecure_http: true on a network you trust", u.Hostname())
	case u.Scheme != "http" && u.Scheme != "https":
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

// looksLikeSecret reports whether a field, header or query parameter name
// suggests a credential, which the configuration must not hold. Not in the
// schema: names compare without case and separators.
func looksLikeSecret(name string) bool {
	n := strings.NewReplacer("_", "", "-", "", ".", "", " ", "").Replace(strings.ToLower(name))
	return slices.ContainsFunc([]string{"secret", "password", "passwd", "token", "apikey", "credential", "privatekey", "accesskey",
		"authorization", "bearer", "cookie"}, func(s string) bool { return strings.Contains(n, s) })
}
