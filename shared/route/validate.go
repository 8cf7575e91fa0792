package route

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/arn"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/retry"
)

// Timeout bounds.
const (
	// DefaultTimeout bounds a target call when the route sets no timeout.
	DefaultTimeout = 10 * time.Second
	// DefaultConcurrency is the calls to one target in flight at once when
	// the route sets none.
	DefaultConcurrency = 8
	// MaxConcurrency bounds target.concurrency.
	MaxConcurrency = 256
	// MaxTimeout is the longest timeout a route may set: a call that may
	// take longer cannot finish inside a dispatch invocation's lease.
	MaxTimeout = 5 * time.Minute
)

// MaxAttemptsCeiling is the largest retry.max_attempts: the database's own
// attempt ceiling (outbox.complete_batch moves a message to dead at 100
// attempts whatever the route says).
const MaxAttemptsCeiling = 100

// PayloadLimit is a target type's payload size default and hard maximum.
type PayloadLimit struct {
	// Default is the route's max_payload_bytes when it sets none.
	Default int
	// Max is the largest max_payload_bytes the target type can carry.
	Max int
}

// PayloadLimits are the max_payload_bytes default and maximum per target
// type: SNS and EventBridge take 256 KiB by default and up to 1 MiB where
// the account or topic is configured for it; an HTTP webhook takes what
// the receiver accepts (1 MiB by default, 10 MiB at most); Lambda's
// synchronous invocation payload limit is 6 MiB.
var PayloadLimits = map[string]PayloadLimit{
	TypeSNS:         {Default: 256 << 10, Max: 1 << 20},
	TypeEventBridge: {Default: 256 << 10, Max: 1 << 20},
	TypeHTTP:        {Default: 1 << 20, Max: 10 << 20},
	TypeLambda:      {Default: 1 << 20, Max: 6 << 20},
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

// SNS limit on a MessageGroupId.
const maxMessageGroupIDLen = 128

// build turns a decoded configuration into a Table, reporting every
// problem with the meaning of its fields.
func build(cfg *fileConfig, ps *problems) *Table {
	switch {
	case cfg.Routes == nil:
		ps.add("routes", "is required: a list of at least one route")
	case len(cfg.Routes) == 0:
		ps.add("routes", "is empty: list at least one route")
	}
	t := &Table{Routes: make([]*Route, 0, len(cfg.Routes))}
	matchedBy := map[Match]int{}
	namedBy := map[string]int{}
	for i := range cfg.Routes {
		r, matchOK := buildRoute(i, &cfg.Routes[i], ps)
		t.Routes = append(t.Routes, r)
		if matchOK {
			if first, dup := matchedBy[r.Match]; dup {
				ps.add(routePath(i)+".match", "namespace %q and topic %q are already matched by routes[%d]; each pair of patterns may appear once",
					r.Match.Namespace, r.Match.Topic, first)
			} else {
				matchedBy[r.Match] = i
			}
		}
		if cfg.Routes[i].Name != "" {
			if first, dup := namedBy[r.Name]; dup {
				ps.add(routePath(i)+".name", "%q is already the name of routes[%d]; names must be unique", r.Name, first)
			} else {
				namedBy[r.Name] = i
			}
		}
	}
	return t
}

func routePath(i int) string { return "routes[" + strconv.Itoa(i) + "]" }

// buildRoute validates one route and applies its defaults. matchOK says
// whether its pattern is valid, so that duplicates can be looked for.
func buildRoute(i int, rc *routeConfig, ps *problems) (r *Route, matchOK bool) {
	p := routePath(i)
	r = &Route{Index: i, Name: p}
	if rc.Name != "" {
		if outbox.NamePattern.MatchString(rc.Name) {
			r.Name = rc.Name
		} else {
			ps.add(p+".name", "%s must be 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit", truncateQuoted(rc.Name))
		}
	}

	if rc.Match == nil {
		ps.add(p+".match", `is required: {"namespace": ..., "topic": ...}, each an exact name or "*"`)
	} else {
		r.Match = Match{Namespace: rc.Match.Namespace, Topic: rc.Match.Topic}
		nsOK := checkPattern(p+".match.namespace", "namespace", rc.Match.Namespace, ps)
		topicOK := checkPattern(p+".match.topic", "topic", rc.Match.Topic, ps)
		matchOK = nsOK && topicOK
	}

	r.Retry = buildRetry(p+".retry", rc.Retry, ps)

	r.Timeout = DefaultTimeout
	concurrency := DefaultConcurrency
	targetType := ""
	if rc.Target == nil {
		ps.add(p+".target", "is required: an object with a type (%s) and that type's fields", strings.Join(TargetTypes, ", "))
	} else {
		targetType = rc.Target.Type
		if rc.Target.Timeout != nil {
			r.Timeout = checkTimeout(p+".target.timeout", *rc.Target.Timeout, ps)
		}
		if c := rc.Target.Concurrency; c != nil {
			if *c < 1 || *c > MaxConcurrency {
				ps.add(p+".target.concurrency", "must be between 1 and %d, got %d", MaxConcurrency, *c)
			} else {
				concurrency = *c
			}
		}
		r.Target = buildTarget(p+".target", rc.Target, r.Match, ps)
	}

	limit, known := PayloadLimits[targetType]
	r.MaxPayloadBytes = limit.Default
	if rc.MaxPayloadBytes != nil {
		n := *rc.MaxPayloadBytes
		switch {
		case n <= 0:
			ps.add(p+".max_payload_bytes", "must be positive, got %d", n)
		case known && n > limit.Max:
			ps.add(p+".max_payload_bytes", "must be at most %d for %s %s target, got %d", limit.Max, article(targetType), targetType, n)
		default:
			r.MaxPayloadBytes = n
		}
	}

	r.OnDead = OnDeadSkip
	if rc.OnDead != nil {
		switch v := *rc.OnDead; v {
		case OnDeadSkip, OnDeadPark:
			r.OnDead = v
		default:
			ps.add(p+".on_dead", "must be %q or %q, got %s", OnDeadSkip, OnDeadPark, truncateQuoted(v))
		}
	}

	r.OnConfigError = OnConfigErrorHold
	if rc.OnConfigError != nil {
		switch v := *rc.OnConfigError; v {
		case OnConfigErrorHold, OnConfigErrorDead:
			r.OnConfigError = v
		default:
			ps.add(p+".on_config_error", "must be %q or %q, got %s", OnConfigErrorHold, OnConfigErrorDead, truncateQuoted(v))
		}
	}

	if len(rc.Schema) > 0 && string(rc.Schema) != "null" {
		sch, canonical, err := compileSchema(rc.Schema, i)
		if err != nil {
			ps.add(p+".schema", "%v", err)
		} else {
			r.schema, r.Schema = sch, canonical
		}
	}

	r.Target.Timeout = r.Timeout
	r.Target.Concurrency = concurrency
	r.Target.MaxPayloadBytes = r.MaxPayloadBytes
	r.Target.key = r.Target.computeKey()
	return r, matchOK
}

func checkPattern(field, what, v string, ps *problems) bool {
	switch {
	case v == "":
		ps.add(field, "is required: an exact %s, or \"*\" to match any", what)
	case v == Wildcard || outbox.NamePattern.MatchString(v):
		return true
	case strings.Contains(v, Wildcard):
		ps.add(field, "%s is neither \"*\" nor an exact %s; partial wildcards are not supported", truncateQuoted(v), what)
	default:
		ps.add(field, "%s is neither \"*\" nor a valid %s: 1-128 characters of letters, digits and . _ : / -, starting with a letter or digit", truncateQuoted(v), what)
	}
	return false
}

func buildRetry(p string, rc *retryConfig, ps *problems) retry.Policy {
	pol := retry.Default
	if rc == nil {
		return pol
	}
	if rc.MaxAttempts != nil {
		switch n := *rc.MaxAttempts; {
		case n < 1:
			ps.add(p+".max_attempts", "must be at least 1, got %d", n)
		case n > MaxAttemptsCeiling:
			ps.add(p+".max_attempts", "must be at most %d (the database's attempt ceiling), got %d", MaxAttemptsCeiling, n)
		default:
			pol.MaxAttempts = n
		}
	}
	baseOK, maxOK := true, true
	if rc.BaseDelay != nil {
		pol.BaseDelay, baseOK = checkDelay(p+".base_delay", *rc.BaseDelay, ps)
	}
	if rc.MaxDelay != nil {
		pol.MaxDelay, maxOK = checkDelay(p+".max_delay", *rc.MaxDelay, ps)
	}
	if baseOK && maxOK && pol.MaxDelay < pol.BaseDelay {
		ps.add(p+".max_delay", "is %s%s, less than base_delay %s%s; max_delay must be at least base_delay",
			formatDuration(pol.MaxDelay), defaultNote(rc.MaxDelay), formatDuration(pol.BaseDelay), defaultNote(rc.BaseDelay))
	}
	return pol
}

func defaultNote(set *string) string {
	if set == nil {
		return " (the default)"
	}
	return ""
}

func checkDelay(field, s string, ps *problems) (time.Duration, bool) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		ps.add(field, "%s is not a duration; write one such as \"500ms\", \"30s\" or \"15m\"", truncateQuoted(s))
		return 0, false
	case d < 0:
		ps.add(field, "must not be negative, got %s", s)
		return 0, false
	}
	return d, true
}

func checkTimeout(field, s string, ps *problems) time.Duration {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		ps.add(field, "%s is not a duration; write one such as \"5s\" or \"1m30s\"", truncateQuoted(s))
	case d <= 0:
		ps.add(field, "must be positive, got %s", s)
	case d > MaxTimeout:
		ps.add(field, "must be at most %s, got %s", formatDuration(MaxTimeout), s)
	default:
		return d
	}
	return DefaultTimeout
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

func buildTarget(p string, tc *targetConfig, m Match, ps *problems) Target {
	t := Target{
		Type:              tc.Type,
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
	switch {
	case tc.Type == "":
		ps.add(p+".type", "is required: one of %s", strings.Join(TargetTypes, ", "))
		return t
	case !slices.Contains(TargetTypes, tc.Type):
		ps.add(p+".type", "%s is not a target type; the types are %s", truncateQuoted(tc.Type), strings.Join(TargetTypes, ", "))
		return t
	}
	checkForeignFields(p, tc, ps)
	switch tc.Type {
	case TypeSNS:
		checkSNS(p, &t, ps)
	case TypeEventBridge:
		checkEventBridge(p, &t, m, ps)
	case TypeHTTP:
		checkHTTP(p, &t, ps)
	case TypeLambda:
		checkLambda(p, &t, ps)
	}
	return t
}

// checkForeignFields reports the fields of other target types that are set
// on a target: they would be ignored, which is never what was meant.
func checkForeignFields(p string, tc *targetConfig, ps *problems) {
	v := reflect.ValueOf(tc).Elem()
	for _, f := range structFields(v.Type()) {
		if f.target == "" || f.target == tc.Type || v.Field(f.index).IsZero() {
			continue
		}
		ps.add(p+"."+f.name, "is a field of %s targets, not of %s %s target", f.target, article(tc.Type), tc.Type)
	}
}

var (
	regionPattern      = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$`)
	accountPattern     = regexp.MustCompile(`^[0-9]{12}$`)
	snsTopicPattern    = regexp.MustCompile(`^[A-Za-z0-9_-]{1,256}$`)
	busNamePattern     = regexp.MustCompile(`^[/.\-_A-Za-z0-9]{1,256}$`)
	envNamePattern     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	secretNamePattern  = regexp.MustCompile(`^[A-Za-z0-9/_+=.@-]{1,512}$`)
	functionPattern    = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	qualifierPattern   = regexp.MustCompile(`^(\$LATEST|[A-Za-z0-9_-]{1,128})$`)
	partialFunctionARN = regexp.MustCompile(`^[0-9]{12}:function:`)
)

// partitions are the AWS partitions a target may live in, with the prefix
// their regions' names start with.
var partitions = map[string]string{"aws": "", "aws-cn": "cn-", "aws-us-gov": "us-gov-"}

// checkARN parses an ARN of a service and checks its partition, region and
// account; it returns the resource part, or a reason.
func checkARN(s, service, example string) (resource, reason string) {
	a, err := arn.Parse(s)
	if err != nil {
		return "", fmt.Sprintf("is not an ARN; want %s", example)
	}
	regionPrefix, known := partitions[a.Partition]
	switch {
	case a.Service != service:
		return "", fmt.Sprintf("is an ARN of service %q, not %q; want %s", a.Service, service, example)
	case !known:
		return "", fmt.Sprintf("has partition %q; the partitions are aws, aws-cn and aws-us-gov", a.Partition)
	case !regionPattern.MatchString(a.Region):
		return "", fmt.Sprintf("has region %q, which is not a region name such as eu-west-1", a.Region)
	case regionPrefix != "" && !strings.HasPrefix(a.Region, regionPrefix),
		regionPrefix == "" && (strings.HasPrefix(a.Region, "cn-") || strings.HasPrefix(a.Region, "us-gov-")):
		return "", fmt.Sprintf("has region %q, which is not in partition %q", a.Region, a.Partition)
	case !accountPattern.MatchString(a.AccountID):
		return "", fmt.Sprintf("has account %q; an account id is 12 digits", a.AccountID)
	}
	return a.Resource, ""
}

const snsExample = "arn:aws:sns:<region>:<12-digit account>:<topic name>"

func checkSNS(p string, t *Target, ps *problems) {
	if t.TopicARN == "" {
		ps.add(p+".topic_arn", "is required for an sns target: %s", snsExample)
	} else if name, reason := checkARN(t.TopicARN, "sns", snsExample); reason != "" {
		ps.add(p+".topic_arn", "%s %s", truncateQuoted(t.TopicARN), reason)
	} else if !snsTopicPattern.MatchString(name) && !(strings.HasSuffix(name, ".fifo") && snsTopicPattern.MatchString(strings.TrimSuffix(name, ".fifo")) && len(name) <= 256) {
		ps.add(p+".topic_arn", "has topic name %s; a topic name is 1-256 letters, digits, - and _, with .fifo at the end of a FIFO topic", truncateQuoted(name))
	}
	if t.MessageGroupID != "" {
		switch {
		case !t.IsFIFO():
			ps.add(p+".message_group_id", "is only for FIFO topics (names ending in .fifo)")
		case len(t.MessageGroupID) > maxMessageGroupIDLen:
			ps.add(p+".message_group_id", "is %d characters, over SNS's limit of %d", len(t.MessageGroupID), maxMessageGroupIDLen)
		case strings.IndexFunc(t.MessageGroupID, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0:
			ps.add(p+".message_group_id", "may contain only letters, digits and punctuation (printable ASCII without spaces)")
		}
	}
}

const busARNExample = "arn:aws:events:<region>:<12-digit account>:event-bus/<name>"

func checkEventBridge(p string, t *Target, m Match, ps *problems) {
	switch {
	case t.EventBus == "":
		ps.add(p+".event_bus", `is required for an eventbridge target: a bus name such as "default", or %s`, busARNExample)
	case arn.IsARN(t.EventBus):
		resource, reason := checkARN(t.EventBus, "events", busARNExample)
		name, isBus := strings.CutPrefix(resource, "event-bus/")
		switch {
		case reason != "":
			ps.add(p+".event_bus", "%s %s", truncateQuoted(t.EventBus), reason)
		case !isBus || !busNamePattern.MatchString(name):
			ps.add(p+".event_bus", "%s is not an event bus ARN; want %s", truncateQuoted(t.EventBus), busARNExample)
		}
	case !busNamePattern.MatchString(t.EventBus):
		ps.add(p+".event_bus", "%s is neither a bus name (1-256 letters, digits and / . - _) nor an event bus ARN", truncateQuoted(t.EventBus))
	}
	if t.Source == "" {
		t.Source = DefaultSource
	}
	if t.DetailType == "" {
		t.DetailType = DefaultDetailType
	}
	if checkTemplate(p+".source", t.Source, ps) {
		source := expandForCheck(t.Source, m)
		switch {
		case strings.HasPrefix(t.Source, "aws."):
			ps.add(p+".source", "%s starts with \"aws.\": AWS reserves that prefix for its own events", truncateQuoted(t.Source))
		case strings.HasPrefix(source, "aws."):
			ps.add(p+".source", "%s expands to %s for this route, which starts with \"aws.\": AWS reserves that prefix for its own events", truncateQuoted(t.Source), truncateQuoted(source))
		case len(source) > maxSourceLen:
			ps.add(p+".source", "expands to %d characters, over EventBridge's limit of %d", len(source), maxSourceLen)
		}
	}
	if checkTemplate(p+".detail_type", t.DetailType, ps) {
		if dt := expandForCheck(t.DetailType, m); len(dt) > maxDetailTypeLen {
			ps.add(p+".detail_type", "expands to %d characters, over EventBridge's limit of %d", len(dt), maxDetailTypeLen)
		}
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

// checkTemplate reports braces that are not {namespace} or {topic}.
func checkTemplate(field, template string, ps *problems) bool {
	for rest := template; rest != ""; {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			break
		}
		rest = rest[i:]
		if rest[0] == '}' {
			ps.add(field, "has a \"}\" without a \"{\"; the placeholders are {namespace} and {topic}")
			return false
		}
		switch {
		case strings.HasPrefix(rest, PlaceholderNamespace):
			rest = rest[len(PlaceholderNamespace):]
		case strings.HasPrefix(rest, PlaceholderTopic):
			rest = rest[len(PlaceholderTopic):]
		default:
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				ps.add(field, "has a \"{\" that is never closed; the placeholders are {namespace} and {topic}")
			} else {
				ps.add(field, "has the unknown placeholder %s; the placeholders are {namespace} and {topic}", truncateQuoted(rest[:end+1]))
			}
			return false
		}
	}
	if strings.IndexFunc(template, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
		ps.add(field, "contains a control character")
		return false
	}
	return true
}

const secretsInline = "secrets are referenced with signing_secret_env or signing_secret_arn, never inline"

const secretARNExample = "arn:aws:secretsmanager:<region>:<12-digit account>:secret:<name>"

func checkHTTP(p string, t *Target, ps *problems) {
	checkURL(p+".url", t.URL, t.AllowInsecureHTTP, ps)

	switch {
	case t.SigningSecretEnv == "" && t.SigningSecretARN == "":
		ps.add(p, "needs signing_secret_env or signing_secret_arn: webhooks are always signed (Standard Webhooks)")
	case t.SigningSecretEnv != "" && t.SigningSecretARN != "":
		ps.add(p, "sets both signing_secret_env and signing_secret_arn; set exactly one")
	case t.SigningSecretEnv != "":
		if !envNamePattern.MatchString(t.SigningSecretEnv) {
			ps.add(p+".signing_secret_env", "%s is not an environment variable name (letters, digits and _, not starting with a digit); the secret itself goes in that variable", truncateQuoted(t.SigningSecretEnv))
		}
	default:
		resource, reason := checkARN(t.SigningSecretARN, "secretsmanager", secretARNExample)
		name, isSecret := strings.CutPrefix(resource, "secret:")
		switch {
		case reason != "":
			ps.add(p+".signing_secret_arn", "%s %s", truncateQuoted(t.SigningSecretARN), reason)
		case !isSecret || !secretNamePattern.MatchString(name):
			ps.add(p+".signing_secret_arn", "%s is not a Secrets Manager secret ARN; want %s", truncateQuoted(t.SigningSecretARN), secretARNExample)
		}
	}

	seen := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(t.Headers)) {
		field := joinPath(p+".headers", name)
		lower := strings.ToLower(name)
		switch {
		case !validHeaderName(name):
			ps.add(field, "%s is not a valid HTTP header name (letters, digits and !#$%%&'*+-.^_`|~)", truncateQuoted(name))
		case looksLikeSecret(name):
			ps.add(field, "would carry a credential inline; %s", secretsInline)
		case reservedHeader(lower):
			ps.add(field, "is reserved: the dispatcher sets it (Content-Type, Content-Length, Host, Idempotency-Key, User-Agent, webhook-*, X-Amzn-*, Outbox-*, and the hop-by-hop headers are all reserved)")
		case seen[lower] != "":
			ps.add(field, "is the same header as %q (header names are case-insensitive)", seen[lower])
		case !validHeaderValue(t.Headers[name]):
			ps.add(field, "has a value with a control character; a CR or LF would split the request")
		}
		seen[lower] = name
	}
}

// reservedHeader reports the headers the dispatcher or net/http sets itself:
// the producer-message reserved set (outbox.ReservedHeader) plus the
// hop-by-hop headers.
func reservedHeader(lower string) bool {
	if outbox.ReservedHeader(lower) {
		return true
	}
	switch lower {
	case "te", "trailer", "upgrade", "keep-alive", "proxy-connection", "expect":
		return true
	}
	return false
}

// validHeaderName reports whether a name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := range len(name) {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue reports whether a value is RFC 9110 field content:
// no control characters but horizontal tab.
func validHeaderValue(v string) bool {
	for i := range len(v) {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func checkURL(field, raw string, allowInsecure bool, ps *problems) {
	if raw == "" {
		ps.add(field, "is required for an http target: an https:// URL")
		return
	}
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
		// Not quoted: the URL holds a password.
		ps.add(field, "contains credentials (user:password@); %s", secretsInline)
		return
	}
	if !u.IsAbs() || u.Host == "" {
		ps.add(field, "%s is not an absolute URL such as https://billing.internal/usage", truncateQuoted(raw))
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

const functionExample = "a function name, name:qualifier, <account>:function:<name> or arn:aws:lambda:<region>:<account>:function:<name>[:qualifier]"

func checkLambda(p string, t *Target, ps *problems) {
	field := p + ".function"
	if t.Function == "" {
		ps.add(field, "is required for a lambda target: %s", functionExample)
		return
	}
	rest := t.Function
	switch {
	case arn.IsARN(rest):
		resource, reason := checkARN(rest, "lambda", "arn:aws:lambda:<region>:<account>:function:<name>")
		if reason != "" {
			ps.add(field, "%s %s", truncateQuoted(t.Function), reason)
			return
		}
		var ok bool
		if rest, ok = strings.CutPrefix(resource, "function:"); !ok {
			ps.add(field, "%s is not a Lambda function ARN; want %s", truncateQuoted(t.Function), functionExample)
			return
		}
	case partialFunctionARN.MatchString(rest):
		rest = rest[len("123456789012:function:"):]
	}
	name, qualifier, hasQualifier := strings.Cut(rest, ":")
	switch {
	case !functionPattern.MatchString(name):
		ps.add(field, "has function name %s; a name is 1-64 letters, digits, - and _ (%s)", truncateQuoted(name), functionExample)
	case hasQualifier && !qualifierPattern.MatchString(qualifier):
		ps.add(field, "has qualifier %s; a qualifier is $LATEST, a version number or an alias (1-128 letters, digits, - and _)", truncateQuoted(qualifier))
	}
}
