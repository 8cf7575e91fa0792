package eventbridge

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// timeBytes is what an entry's Time counts toward its size, whatever the
// time: AWS's formula charges a fixed 14 bytes.
const timeBytes = 14

// EntrySize is the size AWS charges an entry against the PutEvents cap: the
// UTF-8 bytes of Source, DetailType, Detail and each Resources string, plus
// 14 when Time is set. EventBusName and TraceHeader do not count.
// https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-putevent-size.html
func EntrySize(e *types.PutEventsRequestEntry) int {
	n := len(aws.ToString(e.Source)) + len(aws.ToString(e.DetailType)) + len(aws.ToString(e.Detail))
	if e.Time != nil {
		n += timeBytes
	}
	for _, r := range e.Resources {
		n += len(r)
	}
	return n
}

// entryBuilder builds one Publish's entries. Their string and time fields
// point into slabs allocated once per Publish instead of once per field, and
// consecutive messages of one namespace and topic — most batches are one
// stream — share one rendering of Source and DetailType.
type entryBuilder struct {
	p     *Publisher
	strs  []string
	times []time.Time

	// The previous message's namespace and topic, and their rendering.
	rendered                   bool
	lastNamespace, lastTopic   string
	lastSource, lastDetailType *string
	lastErr                    error
}

func (p *Publisher) newEntryBuilder(messages int) *entryBuilder {
	// At most four strings a message: Source, DetailType, Detail and
	// TraceHeader. The capacity is never exceeded, so the pointers handed
	// out stay in one array.
	return &entryBuilder{p: p, strs: make([]string, 0, 4*messages), times: make([]time.Time, 0, messages)}
}

func (b *entryBuilder) str(s string) *string {
	b.strs = append(b.strs, s)
	return &b.strs[len(b.strs)-1]
}

// names renders Source and DetailType for a namespace and topic.
func (b *entryBuilder) names(ns, tp string) (source, detailType *string, err error) {
	if b.rendered && ns == b.lastNamespace && tp == b.lastTopic {
		return b.lastSource, b.lastDetailType, b.lastErr
	}
	source, err = b.render(&b.p.source, ns, tp)
	if err == nil {
		detailType, err = b.render(&b.p.detailType, ns, tp)
	}
	b.rendered, b.lastNamespace, b.lastTopic = true, ns, tp
	b.lastSource, b.lastDetailType, b.lastErr = source, detailType, err
	return source, detailType, err
}

func (b *entryBuilder) render(t *template, ns, tp string) (*string, error) {
	if t.constant != nil {
		return t.constant, nil
	}
	value, err := t.render(ns, tp)
	if err != nil {
		return nil, err
	}
	return b.str(value), nil
}

// entry builds m's PutEvents entry and its size, or says why m cannot be
// sent (an error wrapping one of the package's sentinels).
func (b *entryBuilder) entry(m *outboxtype.Message) (types.PutEventsRequestEntry, int, error) {
	if m == nil {
		return types.PutEventsRequestEntry{}, 0, fmt.Errorf("%w: a nil message", ErrDetailNotObject)
	}
	detail := m.Payload
	if b.p.cloudEvents != nil {
		// The event is an object whatever its data: any payload goes.
		event, err := b.p.cloudEvents.Structured(m)
		if err != nil {
			return types.PutEventsRequestEntry{}, 0, fmt.Errorf("%w: %w", ErrNoCloudEvent, err)
		}
		detail = event
	} else if err := checkDetail(m.Payload); err != nil {
		return types.PutEventsRequestEntry{}, 0, err
	}
	source, detailType, err := b.names(m.Namespace, m.Topic)
	if err != nil {
		return types.PutEventsRequestEntry{}, 0, err
	}
	e := types.PutEventsRequestEntry{
		EventBusName: b.p.bus,
		Source:       source,
		DetailType:   detailType,
		Detail:       b.str(string(detail)),
	}
	if !m.CreatedAt.IsZero() {
		b.times = append(b.times, m.CreatedAt)
		e.Time = &b.times[len(b.times)-1]
	}
	// A trace header EventBridge would refuse fails the whole request with
	// a ValidationException; tracing is not worth a delivery, so one that
	// long (no real X-Ray header is) is left off.
	if m.TraceHeader != "" && utf8.RuneCountInString(m.TraceHeader) <= maxTraceHeaderChars {
		e.TraceHeader = b.str(m.TraceHeader)
	}
	size := EntrySize(&e)
	if size > b.p.maxEntryBytes {
		timeSize := 0
		if e.Time != nil {
			timeSize = timeBytes
		}
		return types.PutEventsRequestEntry{}, 0, fmt.Errorf(
			"%w: the entry is %d bytes (Source %d + DetailType %d + Detail %d + Time %d), over the route's %d-byte cap",
			ErrEntryTooLarge, size, len(*source), len(*detailType), len(detail), timeSize, b.p.maxEntryBytes)
	}
	return e, size, nil
}

// checkDetail refuses a payload EventBridge would: Detail must be a JSON
// object. Payloads come from a jsonb column, so they are valid JSON; the
// first significant byte tells an object from the rest without parsing.
func checkDetail(payload []byte) error {
	for _, c := range payload {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return nil
		case '[':
			return fmt.Errorf("%w: the payload is a JSON array; wrap it in an object to publish it as EventBridge Detail", ErrDetailNotObject)
		}
		return fmt.Errorf("%w: the payload starts with %q; EventBridge Detail must be a JSON object", ErrDetailNotObject, c)
	}
	return fmt.Errorf("%w: the payload is empty; EventBridge Detail must be a JSON object", ErrDetailNotObject)
}

// placeholder is what a template substitutes.
type placeholder uint8

const (
	literal placeholder = iota
	namespace
	topic
)

var placeholders = map[string]placeholder{"{namespace}": namespace, "{topic}": topic}

type templatePart struct {
	kind placeholder
	text string // for literal parts
}

// template is a compiled Source or DetailType template.
type template struct {
	field    string // "Source" or "DetailType", for errors
	maxChars int
	parts    []templatePart
	// constant is the value of a template without placeholders, made once
	// and shared by every entry.
	constant *string
	// literalBytes and uses (how often each placeholder occurs) size
	// render's builder exactly.
	literalBytes int
	uses         [3]int
}

// compileTemplate parses raw once, at New. A brace that does not open
// {namespace} or {topic} is an error, so a typo such as {namspace} fails the
// cold start rather than every message.
func compileTemplate(field, raw string, maxChars int) (template, error) {
	t := template{field: field, maxChars: maxChars}
	rest := raw
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.parts = append(t.parts, templatePart{kind: literal, text: rest})
			t.literalBytes += len(rest)
			break
		}
		if i > 0 {
			t.parts = append(t.parts, templatePart{kind: literal, text: rest[:i]})
			t.literalBytes += i
			rest = rest[i:]
		}
		end := strings.IndexByte(rest, '}')
		kind, ok := placeholder(0), false
		if rest[0] == '{' && end > 0 {
			kind, ok = placeholders[rest[:end+1]]
		}
		if !ok {
			return template{}, fmt.Errorf("eventbridge: Config.%s %q: %s is not a placeholder; use {namespace} or {topic}", field, raw, badPlaceholder(rest))
		}
		t.parts = append(t.parts, templatePart{kind: kind})
		t.uses[kind]++
		rest = rest[end+1:]
	}
	if len(t.parts) == 0 || (len(t.parts) == 1 && t.parts[0].kind == literal) {
		value := raw
		if err := t.check(value); err != nil {
			return template{}, fmt.Errorf("eventbridge: Config.%s: %w", field, err)
		}
		t.constant = &value
	} else if n := utf8.RuneCountInString(t.literalText()); n > maxChars {
		return template{}, fmt.Errorf("eventbridge: Config.%s %q: its literal text alone is %d characters, over EventBridge's %d", field, raw, n, maxChars)
	} else if field == "Source" && t.parts[0].kind == literal && strings.HasPrefix(t.parts[0].text, "aws.") {
		return template{}, fmt.Errorf("eventbridge: Config.Source %q: the aws. namespace is reserved for AWS services", raw)
	}
	return t, nil
}

func badPlaceholder(rest string) string {
	if end := strings.IndexAny(rest[1:], "{}"); end >= 0 && rest[0] == '{' && rest[1+end] == '}' {
		return fmt.Sprintf("%q", rest[:end+2])
	}
	return fmt.Sprintf("the unmatched %q", rest[:1])
}

func (t template) literalText() string {
	var b strings.Builder
	for _, p := range t.parts {
		b.WriteString(p.text)
	}
	return b.String()
}

// render substitutes one message's namespace and topic and checks the
// result against EventBridge's rules for the field.
func (t *template) render(ns, tp string) (string, error) {
	var value string
	if len(t.parts) == 1 {
		// A lone placeholder, such as the default "{topic}": the value is
		// the message's own string, no copy.
		value = ns
		if t.parts[0].kind == topic {
			value = tp
		}
	} else {
		var b strings.Builder
		b.Grow(t.literalBytes + t.uses[namespace]*len(ns) + t.uses[topic]*len(tp))
		for _, p := range t.parts {
			switch p.kind {
			case literal:
				b.WriteString(p.text)
			case namespace:
				b.WriteString(ns)
			case topic:
				b.WriteString(tp)
			}
		}
		value = b.String()
	}
	if err := t.check(value); err != nil {
		return "", err
	}
	return value, nil
}

// check applies EventBridge's rules for Source and DetailType: present, not
// too long (in characters, as AWS counts them), and for Source not in the
// "aws." namespace, which only AWS services may publish in.
func (t template) check(value string) error {
	sentinel := ErrInvalidDetailType
	if t.field == "Source" {
		sentinel = ErrInvalidSource
	}
	switch n := utf8.RuneCountInString(value); {
	case n == 0:
		return fmt.Errorf("%w: %s is empty", sentinel, t.field)
	case n > t.maxChars:
		return fmt.Errorf("%w: %s %q is %d characters, over EventBridge's %d", sentinel, t.field, truncate(value, 64), n, t.maxChars)
	}
	if t.field == "Source" && strings.HasPrefix(value, "aws.") {
		return fmt.Errorf("%w: Source %q is in the aws. namespace, which EventBridge reserves for AWS services", sentinel, truncate(value, 64))
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
