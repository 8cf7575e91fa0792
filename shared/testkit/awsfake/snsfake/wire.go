package snsfake

import (
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

// The query protocol, as the SDK's serializer writes it (service/sns
// serializers.go, awsAwsquery_serializeOpPublishBatch):
//
//	Action=PublishBatch&Version=2010-03-31&TopicArn=...
//	&PublishBatchRequestEntries.member.N.Id=...
//	&PublishBatchRequestEntries.member.N.Message=...
//	&PublishBatchRequestEntries.member.N.MessageAttributes.entry.M.Name=...
//	&PublishBatchRequestEntries.member.N.MessageAttributes.entry.M.Value.DataType=...
//	&PublishBatchRequestEntries.member.N.MessageAttributes.entry.M.Value.StringValue=...
//	&PublishBatchRequestEntries.member.N.MessageAttributes.entry.M.Value.BinaryValue=<base64>
//	&PublishBatchRequestEntries.member.N.MessageGroupId=...
//	&PublishBatchRequestEntries.member.N.MessageDeduplicationId=...
//
// with N and M counted from 1.
const (
	apiVersion    = "2010-03-31"
	xmlNamespace  = "http://sns.amazonaws.com/doc/2010-03-31/"
	entriesPrefix = "PublishBatchRequestEntries.member."
	attrsPrefix   = "MessageAttributes.entry."

	maxBatchEntries   = 10
	maxIndex          = 1000 // of an entry or attribute: bounds what a bad request can allocate
	maxAttributes     = 10
	maxAttributeName  = 256
	maxEntryIDLength  = 80
	maxFIFOIDLength   = 128
	outboxIDAttribute = "outbox.id"
)

// wireError is a whole-call error answer.
type wireError struct {
	status  int
	code    string
	message string
}

func senderError(code, format string, args ...any) *wireError {
	return &wireError{status: http.StatusBadRequest, code: code, message: fmt.Sprintf(format, args...)}
}

type request struct {
	topicARN string
	entries  []Entry
}

// rawAttribute is a message attribute as the form spells it.
type rawAttribute struct{ name, dataType, str, bin string }

// parseRequest decodes a PublishBatch request. It walks the form's pairs
// once, without building url.Values: in a benchmark the fake shares the CPU
// with the client it serves, and SNS's own parsing costs the client nothing.
func parseRequest(r *http.Request) (request, *wireError) {
	if r.Method != http.MethodPost {
		return request{}, senderError("InvalidAction", "snsfake takes POST requests, got %s", r.Method)
	}
	body, err := readBody(r)
	if err != nil {
		return request{}, senderError("MalformedQueryString", "reading the body: %v", err)
	}
	var (
		req             request
		action, version string
		entries         []*Entry
		attrs           [][]*rawAttribute
		seenAction      bool
	)
	for pair := range strings.SplitSeq(body, "&") {
		if pair == "" {
			continue
		}
		rawKey, rawValue, _ := strings.Cut(pair, "=")
		key, err1 := url.QueryUnescape(rawKey)
		value, err2 := url.QueryUnescape(rawValue)
		if err1 != nil || err2 != nil {
			return request{}, senderError("MalformedQueryString", "pair %q is not URL-encoded", pair)
		}
		switch key {
		case "Action":
			action, seenAction = value, true
			continue
		case "Version":
			version = value
			continue
		case "TopicArn":
			req.topicARN = value
			continue
		case "PublishBatchRequestEntries":
			continue // how the query protocol spells an empty list
		}
		rest, ok := strings.CutPrefix(key, entriesPrefix)
		if !ok {
			return request{}, senderError("InvalidParameter", "unknown parameter %s", key)
		}
		n, field, ok := cutIndex(rest)
		if !ok {
			return request{}, senderError("MalformedQueryString", "parameter %s", key)
		}
		for len(entries) < n {
			entries, attrs = append(entries, nil), append(attrs, nil)
		}
		e := entries[n-1]
		if e == nil {
			e = &Entry{}
			entries[n-1] = e
		}
		switch field {
		case "Id":
			e.ID = value
		case "Message":
			e.Message = value
		case "MessageGroupId":
			e.MessageGroupId = value
		case "MessageDeduplicationId":
			e.MessageDeduplicationId = value
		case "Subject":
			e.Subject = value
		case "MessageStructure":
			e.MessageStructure = value
		default:
			attrRest, ok := strings.CutPrefix(field, attrsPrefix)
			if !ok {
				return request{}, senderError("InvalidParameter", "unknown parameter %s", key)
			}
			m, attrField, ok := cutIndex(attrRest)
			if !ok {
				return request{}, senderError("MalformedQueryString", "parameter %s", key)
			}
			for len(attrs[n-1]) < m {
				attrs[n-1] = append(attrs[n-1], nil)
			}
			a := attrs[n-1][m-1]
			if a == nil {
				a = &rawAttribute{}
				attrs[n-1][m-1] = a
			}
			switch attrField {
			case "Name":
				a.name = value
			case "Value.DataType":
				a.dataType = value
			case "Value.StringValue":
				a.str = value
			case "Value.BinaryValue":
				a.bin = value
			default:
				return request{}, senderError("InvalidParameter", "unknown parameter %s", key)
			}
		}
	}
	switch {
	case !seenAction || action != "PublishBatch":
		return request{}, senderError("InvalidAction", "snsfake implements PublishBatch only, got Action %q", action)
	case version != apiVersion:
		return request{}, senderError("InvalidParameter", "Version %q, want %s", version, apiVersion)
	case req.topicARN == "":
		return request{}, senderError("InvalidParameter", "Invalid parameter: TopicArn")
	}

	req.entries = make([]Entry, 0, len(entries))
	for n, e := range entries {
		if e == nil {
			return request{}, senderError("MalformedQueryString", "%sN is not numbered 1 to %d", entriesPrefix, len(entries))
		}
		e.TopicArn = req.topicARN
		e.Attributes = make(map[string]Attribute, len(attrs[n]))
		for _, a := range attrs[n] {
			if a == nil {
				return request{}, senderError("MalformedQueryString", "message attributes of entry %d are not numbered 1 to %d", n+1, len(attrs[n]))
			}
			if _, dup := e.Attributes[a.name]; dup {
				return request{}, senderError("InvalidParameter", "entry %d names message attribute %q twice", n+1, a.name)
			}
			attr := Attribute{DataType: a.dataType, StringValue: a.str}
			if a.bin != "" {
				b, err := base64.StdEncoding.DecodeString(a.bin)
				if err != nil {
					return request{}, senderError("InvalidParameterValue", "BinaryValue of %q is not base64: %v", a.name, err)
				}
				attr.BinaryValue = b
			}
			e.Attributes[a.name] = attr
		}
		e.OutboxID = outboxID(*e)
		req.entries = append(req.entries, *e)
	}
	return req, nil
}

func readBody(r *http.Request) (string, error) {
	if r.ContentLength < 0 {
		b, err := io.ReadAll(r.Body)
		return string(b), err
	}
	b := make([]byte, r.ContentLength)
	_, err := io.ReadFull(r.Body, b)
	return string(b), err
}

// cutIndex splits "12.Rest" into 12 and "Rest".
func cutIndex(s string) (int, string, bool) {
	num, rest, ok := strings.Cut(s, ".")
	if !ok {
		return 0, "", false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > maxIndex {
		return 0, "", false
	}
	return n, rest, true
}

func outboxID(e Entry) uuid.UUID {
	if a, ok := e.Attributes[outboxIDAttribute]; ok {
		if id, err := uuid.Parse(a.StringValue); err == nil {
			return id
		}
	}
	if id, err := publishtest.MessageID([]byte(e.Message)); err == nil {
		return id
	}
	return uuid.Nil
}

func isFIFO(topicARN string) bool { return strings.HasSuffix(topicARN, ".fifo") }

// validate applies the rules SNS applies to a request as a whole.
func (s *Server) validate(req request) *wireError {
	switch n := len(req.entries); {
	case n == 0:
		return senderError("EmptyBatchRequest", "The batch request doesn't contain any entries.")
	case n > maxBatchEntries:
		return senderError("TooManyEntriesInBatchRequest", "The batch request contains more entries than permissible: %d.", n)
	}
	ids := make([]string, 0, len(req.entries))
	total := 0
	for _, e := range req.entries {
		if !validEntryID(e.ID) {
			return senderError("InvalidBatchEntryId", "The Id of a batch entry in a batch request doesn't abide by the specification: %q.", e.ID)
		}
		if slices.Contains(ids, e.ID) {
			return senderError("BatchEntryIdsNotDistinct", "Two or more batch entries in the request have the same Id: %q.", e.ID)
		}
		ids = append(ids, e.ID)
		total += e.Size()
	}
	if total > s.maxMessageBytes {
		return senderError("BatchRequestTooLong", "The length of all the messages put together is more than the limit: %d > %d bytes.", total, s.maxMessageBytes)
	}
	fifo := isFIFO(req.topicARN)
	for _, e := range req.entries {
		switch {
		case fifo && e.MessageGroupId == "":
			return senderError("InvalidParameter", "Invalid parameter: The MessageGroupId parameter is required for FIFO topics")
		case fifo && !validFIFOID(e.MessageGroupId):
			return senderError("InvalidParameter", "Invalid parameter: MessageGroupId %q", e.MessageGroupId)
		case fifo && e.MessageDeduplicationId == "":
			return senderError("InvalidParameter", "Invalid parameter: The topic should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly")
		case fifo && !validFIFOID(e.MessageDeduplicationId):
			return senderError("InvalidParameter", "Invalid parameter: MessageDeduplicationId %q", e.MessageDeduplicationId)
		case !fifo && e.MessageDeduplicationId != "":
			return senderError("InvalidParameter", "Invalid parameter: MessageDeduplicationId Reason: The request includes MessageDeduplicationId parameter that is not valid for this topic type")
		}
	}
	return nil
}

// entryProblem applies the rules SNS applies to one entry; "" when it is
// acceptable.
func entryProblem(e Entry) string {
	if e.Message == "" {
		return "Invalid parameter: Empty message"
	}
	if !validText(e.Message) {
		return "Invalid parameter: Message contains characters SNS does not accept"
	}
	if len(e.Attributes) > maxAttributes {
		return fmt.Sprintf("Invalid parameter: %d message attributes, more than %d", len(e.Attributes), maxAttributes)
	}
	for name, a := range e.Attributes {
		if msg := attributeNameProblem(name); msg != "" {
			return fmt.Sprintf("Invalid parameter: message attribute name %q %s", name, msg)
		}
		kind, _, _ := strings.Cut(a.DataType, ".")
		switch kind {
		case "String", "Number":
			if a.StringValue == "" {
				return fmt.Sprintf("The message attribute '%s' must contain non-empty message attribute value for message attribute type '%s'.", name, kind)
			}
			if !validText(a.StringValue) {
				return fmt.Sprintf("The message attribute '%s' contains characters SNS does not accept.", name)
			}
			if kind == "Number" {
				if _, err := strconv.ParseFloat(a.StringValue, 64); err != nil {
					return fmt.Sprintf("Could not cast message attribute '%s' value to number.", name)
				}
			}
		case "Binary":
			if len(a.BinaryValue) == 0 {
				return fmt.Sprintf("The message attribute '%s' must contain non-empty message attribute value for message attribute type 'Binary'.", name)
			}
		default:
			return fmt.Sprintf("The message attribute '%s' has an invalid message attribute type, the set of supported type prefixes is Binary, Number, and String.", name)
		}
	}
	return ""
}

func attributeNameProblem(name string) string {
	switch {
	case name == "":
		return "is empty"
	case len(name) > maxAttributeName:
		return "is longer than 256 characters"
	case hasPrefixFold(name, "AWS.") || hasPrefixFold(name, "Amazon."):
		return "uses a reserved prefix"
	case name[0] == '.' || name[len(name)-1] == '.':
		return "starts or ends with a period"
	case strings.Contains(name, ".."):
		return "has consecutive periods"
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return "has a character outside A-Z a-z 0-9 _ - ."
		}
	}
	return ""
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func validEntryID(id string) bool {
	if id == "" || len(id) > maxEntryIDLength {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validFIFOID: 1 to 128 letters, digits and ASCII punctuation.
func validFIFOID(id string) bool {
	if id == "" || len(id) > maxFIFOIDLength {
		return false
	}
	for _, c := range []byte(id) {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// validText: the characters SNS accepts in a message or attribute value
// (those of XML 1.0), in valid UTF-8.
func validText(s string) bool {
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			return false // invalid UTF-8, not a real U+FFFD
		case r == '\t' || r == '\n' || r == '\r':
		case r < 0x20:
			return false
		case r == 0xfffe || r == 0xffff:
			return false
		}
	}
	return true
}

// The answers, in the shape the SDK's deserializers read
// (awsAwsquery_deserializeOpPublishBatch, GetErrorResponseComponents).

type successEntry struct {
	ID             string `xml:"Id"`
	MessageID      string `xml:"MessageId"`
	SequenceNumber string `xml:"SequenceNumber,omitempty"`
}

type failedEntry struct {
	ID          string `xml:"Id"`
	Code        string `xml:"Code"`
	Message     string `xml:"Message"`
	SenderFault bool   `xml:"SenderFault"`
}

type batchResult struct {
	Successful []successEntry
	Failed     []failedEntry
}

// The Successful and Failed elements are always written, empty or not, as
// SNS writes them.
type publishBatchResponse struct {
	XMLName xml.Name `xml:"PublishBatchResponse"`
	Xmlns   string   `xml:"xmlns,attr"`
	Result  struct {
		Successful struct {
			Members []successEntry `xml:"member"`
		} `xml:"Successful"`
		Failed struct {
			Members []failedEntry `xml:"member"`
		} `xml:"Failed"`
	} `xml:"PublishBatchResult"`
	RequestID string `xml:"ResponseMetadata>RequestId"`
}

type errorResponse struct {
	XMLName xml.Name `xml:"ErrorResponse"`
	Xmlns   string   `xml:"xmlns,attr"`
	Error   struct {
		Type    string `xml:"Type"`
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	} `xml:"Error"`
	RequestID string `xml:"RequestId"`
}

func writeResult(w http.ResponseWriter, r batchResult, requestID string) {
	var resp publishBatchResponse
	resp.Xmlns = xmlNamespace
	resp.Result.Successful.Members = r.Successful
	resp.Result.Failed.Members = r.Failed
	resp.RequestID = requestID
	writeXML(w, http.StatusOK, resp)
}

func writeError(w http.ResponseWriter, status int, code, message, requestID string) {
	var resp errorResponse
	resp.Xmlns = xmlNamespace
	resp.Error.Type = "Sender"
	if status >= 500 {
		resp.Error.Type = "Receiver"
	}
	resp.Error.Code, resp.Error.Message = code, message
	resp.RequestID = requestID
	writeXML(w, status, resp)
}

func writeXML(w http.ResponseWriter, status int, v any) {
	body, err := xml.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("snsfake: encoding the answer: %v", err))
	}
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("Content-Length", strconv.Itoa(len(xml.Header)+len(body)))
	w.WriteHeader(status)
	w.Write([]byte(xml.Header))
	w.Write(body)
}
