package sns

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	producerheaders "github.com/outboxkit/dispatcher/shared/outbox/headers"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
)

// The message attributes the publisher sets on every SNS message, before the
// message's own headers. Subscribers filter and deduplicate on them; they
// are part of the wire contract. Optional ones are sent only when the
// message has the value.
const (
	AttributeID          = "outbox.id"           // String: the message id, stable across attempts and replays
	AttributeNamespace   = "outbox.namespace"    // String
	AttributeTopic       = "outbox.topic"        // String
	AttributeTenantID    = "outbox.tenant_id"    // String, optional
	AttributeDedupeKey   = "outbox.dedupe_key"   // String, optional: the producer's idempotency key
	AttributeSequenceID  = "outbox.sequence_id"  // Number, optional: the order within the ordering key
	AttributeAttempt     = "outbox.attempt"      // Number: the delivery attempt, from 1
	AttributeTraceHeader = "outbox.trace_header" // String, optional: the producer's X-Ray trace header
	// AttributeExtendedPayloadSize (Number) is set on a message whose
	// payload was offloaded to S3, with the payload's size: with the
	// PayloadS3Pointer body it is the AWS payload-offloading format, which
	// the SNS and SQS Extended Client Libraries read.
	AttributeExtendedPayloadSize = "ExtendedPayloadSize"
)

// reservedHeaderPrefix keeps headers from shadowing the publisher's own
// attributes (compared case-insensitively, like the producer's check).
const reservedHeaderPrefix = "outbox."

// SNS's limits on one entry.
const (
	maxBatchEntries    = 10
	maxAttributes      = 10
	maxAttributeName   = 256
	maxFIFOIDLength    = 128
	fixedAttributes    = 4 // id, namespace, topic, attempt
	dataTypeStringName = "String"
	dataTypeNumberName = "Number"
)

// Shared, never written: the SDK only reads the pointers it is given.
var (
	dataTypeString = aws.String(dataTypeStringName)
	dataTypeNumber = aws.String(dataTypeNumberName)
	// entryIDs are the entry ids of a request: the entry's index in its
	// call, which is unique per request and maps an answer back to its
	// entry without a lookup.
	entryIDs = func() (ids [maxBatchEntries]*string) {
		for i := range ids {
			ids[i] = aws.String(strconv.Itoa(i))
		}
		return ids
	}()
)

// Rule is an SNS rule a message broke, making it impossible to send as it is.
type Rule string

// The rules, named in InvalidMessageError.
const (
	RuleTooManyAttributes  Rule = "SNS allows at most 10 message attributes"
	RuleEmptyName          Rule = "an attribute name may not be empty"
	RuleNameTooLong        Rule = "an attribute name may have at most 256 characters"
	RuleNameCharacters     Rule = "an attribute name may only contain A-Z a-z 0-9 _ - ."
	RuleNameReservedPrefix Rule = `an attribute name may not start with "AWS." or "Amazon."`
	RuleNamePeriods        Rule = "an attribute name may not start or end with a period, nor have two in a row"
	RuleNameOutboxPrefix   Rule = `a header name may not start with "outbox.", which the publisher's own attributes use`
	RuleEmptyValue         Rule = "an attribute value may not be empty"
	RuleValueCharacters    Rule = "an attribute value may only contain the characters SNS accepts (XML 1.0 characters)"
	RuleEmptyBody          Rule = "the message body may not be empty"
	RuleBodyCharacters     Rule = "the message body may only contain the characters SNS accepts (XML 1.0 characters)"
	RuleCloudEvent         Rule = "the message cannot be written as a CloudEvent"
)

// InvalidMessageError says why a message cannot be sent to SNS as it is. The
// publisher answers it as a terminal INVALID_PAYLOAD without a call: sending
// would fail the same way on every attempt, and dropping the offending
// header instead would deliver something the producer did not write.
type InvalidMessageError struct {
	// Attribute is the offending attribute or header name; empty for a rule
	// about the body or the attribute count.
	Attribute string
	// Rule is the rule broken.
	Rule Rule
	// Detail adds what was found, such as the attribute count.
	Detail string
}

func (e *InvalidMessageError) Error() string {
	var b strings.Builder
	b.WriteString("sns: message cannot be sent: ")
	b.WriteString(string(e.Rule))
	if e.Attribute != "" {
		fmt.Fprintf(&b, ": attribute %q", e.Attribute)
	}
	if e.Detail != "" {
		b.WriteString(" (")
		b.WriteString(e.Detail)
		b.WriteString(")")
	}
	return b.String()
}

// TooLargeError says a message is over the topic's size cap. The publisher
// answers it as a terminal PAYLOAD_TOO_LARGE without a call.
type TooLargeError struct {
	// Size is the message's size as SNS counts it: BodyBytes plus
	// AttributeBytes.
	Size, BodyBytes, AttributeBytes int
	// Limit is the topic's cap (Config.MaxMessageBytes).
	Limit int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("sns: message is %d bytes (body %d, attributes %d), over the topic's cap of %d",
		e.Size, e.BodyBytes, e.AttributeBytes, e.Limit)
}

// encode turns one message into a PublishBatch entry (without its Id) and
// its size as SNS counts it: the body plus each attribute's name, data type
// and value. The error is an *InvalidMessageError or a *TooLargeError.
func (p *Publisher) encode(m *outboxtype.Message) (types.PublishBatchRequestEntry, int, error) {
	var entry types.PublishBatchRequestEntry
	if len(m.Payload) == 0 {
		return entry, 0, &InvalidMessageError{Rule: RuleEmptyBody}
	}
	body := string(m.Payload)
	if p.cloudEvents != nil {
		event, err := p.cloudEvents.Structured(m)
		if err != nil {
			return entry, 0, &InvalidMessageError{Rule: RuleCloudEvent, Detail: err.Error()}
		}
		body = string(event)
	}
	if !validText(body) {
		return entry, 0, &InvalidMessageError{Rule: RuleBodyCharacters}
	}

	count := fixedAttributes + len(m.Headers)
	for _, set := range [...]bool{m.TenantID != "", m.DedupeKey != "", m.SequenceID != 0, m.TraceHeader != "", m.Offload != nil} {
		if set {
			count++
		}
	}
	traceHeader := m.TraceHeader
	if count > maxAttributes && traceHeader != "" && traceHeader == producerheaders.XRayTraceHeader(m.Headers[producerheaders.TraceParent]) {
		// X-Ray's form of the message's traceparent, which the dispatcher
		// made: the traceparent attribute carries the same trace, and a
		// trace is not worth a delivery.
		traceHeader = ""
		count--
	}
	if count > maxAttributes {
		return entry, 0, &InvalidMessageError{Rule: RuleTooManyAttributes,
			Detail: fmt.Sprintf("%d: %d the outbox's own and %d headers", count, count-len(m.Headers), len(m.Headers))}
	}
	if err := checkHeaders(m.Headers); err != nil {
		return entry, 0, err
	}

	attrs := make(map[string]types.MessageAttributeValue, count)
	attrBytes := 0
	add := func(name string, dataType *string, value string) {
		attrs[name] = types.MessageAttributeValue{DataType: dataType, StringValue: aws.String(value)}
		attrBytes += len(name) + len(*dataType) + len(value)
	}
	// Empty values are checked in checkHeaders for headers; the outbox's own
	// required values are never empty in a claimed message, but a message
	// built by hand might be, and SNS would refuse it for the whole batch.
	for _, a := range [...]struct{ name, value string }{
		{AttributeID, m.ID.String()}, {AttributeNamespace, m.Namespace}, {AttributeTopic, m.Topic},
	} {
		if a.value == "" {
			return entry, 0, &InvalidMessageError{Attribute: a.name, Rule: RuleEmptyValue}
		}
		if !validText(a.value) {
			return entry, 0, &InvalidMessageError{Attribute: a.name, Rule: RuleValueCharacters}
		}
		add(a.name, dataTypeString, a.value)
	}
	add(AttributeAttempt, dataTypeNumber, strconv.Itoa(m.Attempt))
	if m.SequenceID != 0 {
		add(AttributeSequenceID, dataTypeNumber, strconv.FormatInt(m.SequenceID, 10))
	}
	for _, a := range [...]struct{ name, value string }{
		{AttributeTenantID, m.TenantID}, {AttributeDedupeKey, m.DedupeKey}, {AttributeTraceHeader, traceHeader},
	} {
		if a.value == "" {
			continue
		}
		if !validText(a.value) {
			return entry, 0, &InvalidMessageError{Attribute: a.name, Rule: RuleValueCharacters}
		}
		add(a.name, dataTypeString, a.value)
	}
	for name, value := range m.Headers {
		add(name, dataTypeString, value)
	}
	if m.Offload != nil { // after the headers: a header of that name cannot shadow it
		add(AttributeExtendedPayloadSize, dataTypeNumber, strconv.Itoa(m.Offload.Size))
	}

	size := len(body) + attrBytes
	if size > p.maxMessageBytes {
		return entry, 0, &TooLargeError{Size: size, BodyBytes: len(body), AttributeBytes: attrBytes, Limit: p.maxMessageBytes}
	}

	entry.Message = &body
	entry.MessageAttributes = attrs
	if p.fifo {
		group := p.defaultGroupID
		if m.OrderingKey != "" {
			group = fifoID(m.OrderingKey)
		}
		entry.MessageGroupId = aws.String(group)
		entry.MessageDeduplicationId = aws.String(deduplicationID(m))
	}
	return entry, size, nil
}

// checkHeaders applies SNS's attribute rules to the message's headers. With
// several bad headers it names the first in byte order, so that every
// attempt reports the same one whatever the map's iteration order.
func checkHeaders(headers map[string]string) error {
	var first *InvalidMessageError
	for name, value := range headers {
		if first != nil && name >= first.Attribute {
			continue
		}
		rule := nameRule(name)
		switch {
		case rule != "":
		case value == "":
			rule = RuleEmptyValue
		case !validText(value):
			rule = RuleValueCharacters
		default:
			continue
		}
		first = &InvalidMessageError{Attribute: name, Rule: rule}
	}
	if first != nil {
		return first
	}
	return nil
}

// nameRule is the rule a header name breaks as an SNS attribute name, "" for
// none.
func nameRule(name string) Rule {
	switch {
	case name == "":
		return RuleEmptyName
	case len(name) > maxAttributeName:
		return RuleNameTooLong
	case hasPrefixFold(name, "AWS.") || hasPrefixFold(name, "Amazon."):
		return RuleNameReservedPrefix
	case hasPrefixFold(name, reservedHeaderPrefix):
		return RuleNameOutboxPrefix
	case name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, ".."):
		return RuleNamePeriods
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return RuleNameCharacters
		}
	}
	return ""
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// validText reports whether s has only the characters SNS accepts in a
// message or an attribute value, those of XML 1.0: tab, LF, CR, and U+0020
// to U+10FFFF less the surrogates, U+FFFE and U+FFFF, in valid UTF-8. ASCII,
// by far the common case, takes the fast path.
func validText(s string) bool {
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c < 0x20 && c != '\t' && c != '\n' && c != '\r' {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || r == 0xfffe || r == 0xffff {
			return false
		}
		i += n
	}
	return true
}

// fifoID makes key a valid MessageGroupId or MessageDeduplicationId: 1 to
// 128 letters, digits and ASCII punctuation. A key that does not fit is
// replaced by the hex SHA-256 of its bytes (64 characters): deterministic,
// so every attempt and replay of a message sends the same id and SNS still
// deduplicates retries and keeps the group together, while distinct keys
// stay distinct.
func fifoID(key string) string {
	if validFIFOID(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func validFIFOID(id string) bool {
	if id == "" || len(id) > maxFIFOIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// deduplicationID is the MessageDeduplicationId of m on a FIFO topic: the
// producer's dedupe key scoped to its namespace and topic
// ("namespace|topic|key"), else the message id. The outbox guarantees a
// dedupe key unique per (namespace, topic) only; one FIFO topic often takes
// several outbox topics (a route "payments/*"), and an unscoped key shared
// by two of them would make SNS drop the second message as a duplicate —
// silently, within its five-minute window. "|" cannot occur in a namespace
// or topic, so the scoped form is unambiguous.
func deduplicationID(m *outboxtype.Message) string {
	if m.DedupeKey == "" {
		return m.ID.String()
	}
	return fifoID(m.Namespace + "|" + m.Topic + "|" + m.DedupeKey)
}
