package eventbridge

import (
	"bytes"
	"context"
	"net/http"
	"unicode/utf8"
	"unsafe"

	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/smithy-go"
	smithyencoding "github.com/aws/smithy-go/encoding"
	smithytime "github.com/aws/smithy-go/time"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// putEventsProtocol is the SDK's awsJson1_1 protocol with PutEvents'
// request body written by this package; every other operation, and every
// answer, is the SDK's.
//
// Why by hand: a dispatch function at Lambda's CPU share for 256 MB spends
// its CPU per message on the SDK's PutEvents call, ten entries at most per
// call, and the SDK's JSON serializer writes each entry's Detail — a JSON
// document, so full of quotes to escape — through a general shape
// serializer a byte at a time past the first quote, into a buffer grown by
// doubling, then copies it out. Here the body is written once into a
// buffer sized from the entries, plain runs tested eight bytes at a time:
// a call of ten 512-byte entries costs the client 45–50 µs against 57–69
// (BenchmarkPutEventsCall). The request is the SDK's byte for byte:
// TestPutEventsRequestIsTheSDKs and its fuzz target compare them. Signing,
// the payload hash, endpoints, retries and reading the answer stay the
// SDK's (a reader of EventBridge's plain answers saved nothing measurable
// and was not kept).
type putEventsProtocol struct {
	smithyhttp.ClientProtocol
}

// The SDK's protocol sets these on every awsJson1_1 request.
const (
	putEventsTarget = "AWSEvents.PutEvents"
	jsonContentType = "application/x-amz-json-1.1"
	putEventsOpName = "PutEvents"
)

func (p putEventsProtocol) SerializeRequest(ctx context.Context, schema *smithy.OperationSchema, in smithy.Serializable, req *smithyhttp.Request) error {
	input, ok := in.(*eventbridge.PutEventsInput)
	if !ok || schema.ID().Name != putEventsOpName {
		return p.ClientProtocol.SerializeRequest(ctx, schema, in, req)
	}
	req.Method = http.MethodPost
	if len(req.URL.Path) == 0 {
		req.URL.Path = "/"
	}
	req.Header.Set("X-Amz-Target", putEventsTarget)
	req.Header.Set("Content-Type", jsonContentType)
	sent, err := req.SetStream(bytes.NewReader(appendPutEventsRequest(nil, input)))
	if err != nil {
		return err
	}
	*req = *sent
	return nil
}

// appendPutEventsRequest appends the JSON body the SDK's serializer writes
// for in: members in the model's order, absent (nil) members left out,
// Time as epoch seconds, strings escaped as appendJSONString says.
func appendPutEventsRequest(dst []byte, in *eventbridge.PutEventsInput) []byte {
	if dst == nil {
		dst = make([]byte, 0, putEventsRequestSize(in))
	}
	o := jsonObject{dst: append(dst, '{')}
	o.string("EndpointId", in.EndpointId)
	if in.Entries != nil {
		o.key("Entries")
		o.dst = append(o.dst, '[')
		for i := range in.Entries {
			if i > 0 {
				o.dst = append(o.dst, ',')
			}
			o.dst = appendEntry(o.dst, &in.Entries[i])
		}
		o.dst = append(o.dst, ']')
	}
	return append(o.dst, '}')
}

func appendEntry(dst []byte, e *types.PutEventsRequestEntry) []byte {
	o := jsonObject{dst: append(dst, '{')}
	o.string("Detail", e.Detail)
	o.string("DetailType", e.DetailType)
	o.string("EventBusName", e.EventBusName)
	if e.Resources != nil {
		o.key("Resources")
		o.dst = append(o.dst, '[')
		for i, r := range e.Resources {
			if i > 0 {
				o.dst = append(o.dst, ',')
			}
			o.dst = appendJSONString(o.dst, r)
		}
		o.dst = append(o.dst, ']')
	}
	o.string("Source", e.Source)
	if e.Time != nil {
		o.key("Time")
		o.dst = smithyencoding.EncodeFloat(o.dst, smithytime.FormatEpochSeconds(*e.Time), 64)
	}
	o.string("TraceHeader", e.TraceHeader)
	return append(o.dst, '}')
}

// jsonObject appends an object's members to dst, after its opening brace.
type jsonObject struct {
	dst     []byte
	members int
}

// key appends a member's name, after a comma unless it is the first.
func (o *jsonObject) key(name string) {
	if o.members > 0 {
		o.dst = append(o.dst, ',')
	}
	o.members++
	o.dst = append(o.dst, '"')
	o.dst = append(o.dst, name...)
	o.dst = append(o.dst, '"', ':')
}

// string appends a string member, or nothing for nil, as the SDK leaves
// an absent member out.
func (o *jsonObject) string(name string, v *string) {
	if v != nil {
		o.key(name)
		o.dst = appendJSONString(o.dst, *v)
	}
}

// putEventsRequestSize is room for in's body with a few escapes: enough
// that the buffer is allocated once for the entries the publisher builds.
func putEventsRequestSize(in *eventbridge.PutEventsInput) int {
	size := 64
	for i := range in.Entries {
		e := &in.Entries[i]
		size += 128
		for _, s := range []*string{e.Detail, e.DetailType, e.EventBusName, e.Source, e.TraceHeader} {
			if s != nil {
				size += len(*s) + len(*s)/8
			}
		}
		for _, r := range e.Resources {
			size += len(r) + 3
		}
	}
	return size
}

// jsonSafe are the ASCII bytes the SDK's serializer writes as they are:
// the printable ones but the quote and the backslash.
var jsonSafe = func() (safe [utf8.RuneSelf]bool) {
	for b := ' '; b < utf8.RuneSelf-1; b++ {
		safe[b] = b != '"' && b != '\\'
	}
	return safe
}()

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string exactly as the SDK's JSON
// serializer writes it: `"` and `\` and \n, \r, \t escaped by a backslash,
// other control bytes and DEL as \u00XX, U+2028 and U+2029 as \u2028 and
// \u2029, each invalid UTF-8 byte as U+FFFD, everything else as it is.
// Runs of bytes written as they are go in one copy.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		i += plainPrefix(s[i:])
		if i == len(s) {
			break
		}
		b := s[i]
		if b < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\ufffd"...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Word-at-a-time byte tests (the classic "has a zero byte" and "has a byte
// less than n" bit tricks): exact as a yes or no for a whole word.
const (
	eachByte  = 0x0101010101010101
	highBits  = 0x8080808080808080
	eightWide = 8
)

func hasZeroByte(w uint64) bool { return (w-eachByte)&^w&highBits != 0 }

// plainPrefix is the length of s's leading run of bytes jsonSafe passes.
// A Detail is a JSON document, about one byte in forty a quote, so the run
// is tested eight bytes at a time: the byte-at-a-time loop was 0.9 µs of a
// 512-byte Detail, as much as the SDK's serializer. The eight bytes are
// read in place (unsafe): copying them out of the string would cost what
// the word test saves.
func plainPrefix(s string) int {
	i := 0
	for ; i+eightWide <= len(s); i += eightWide {
		w := *(*uint64)(unsafe.Pointer(unsafe.StringData(s[i:])))
		control := (w - eachByte*' ') &^ w & highBits
		if w&highBits != 0 || control != 0 || hasZeroByte(w^(eachByte*'"')) ||
			hasZeroByte(w^(eachByte*'\\')) || hasZeroByte(w^(eachByte*0x7f)) {
			break
		}
	}
	for i < len(s) && s[i] < utf8.RuneSelf && jsonSafe[s[i]] {
		i++
	}
	return i
}
