package sns

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// deserializerID is the ID of the SDK's response deserializer in an
// operation's middleware stack.
const deserializerID = "OperationDeserializer"

// publishBatchOperation is the stack's ID for PublishBatch calls.
const publishBatchOperation = "PublishBatch"

// swapPublishBatchDeserializer puts publishBatchDeserializer in place of the
// SDK's deserializer in a PublishBatch call's stack (an APIOptions
// function); other operations keep the SDK's.
func swapPublishBatchDeserializer(stack *middleware.Stack) error {
	if stack.ID() != publishBatchOperation {
		return nil
	}
	sdk, ok := stack.Deserialize.Get(deserializerID)
	if !ok {
		return fmt.Errorf("sns: the SDK's stack has no %s to replace", deserializerID)
	}
	_, err := stack.Deserialize.Swap(deserializerID, &publishBatchDeserializer{sdk: sdk})
	return err
}

// maxFastResponseBytes bounds the answers publishBatchDeserializer reads
// itself: ten entries' answer is about 1.5 KiB.
const maxFastResponseBytes = 64 << 10

// publishBatchDeserializer reads a successful PublishBatch answer into the
// PublishBatchOutput the SDK's deserializer builds from it
// (TestDeserializerBuildsWhatTheSDKBuilds and its fuzz target compare the
// two), at a fraction of its cost: the SDK's goes through encoding/xml's
// tokenizer, 15% of a dispatch bootstrap's CPU to SNS at Lambda's share.
// It reads only the plain form SNS writes (parsePublishBatchResponse);
// an error status, an answer in any other form, and every other operation
// go to the SDK's deserializer, given the same response.
type publishBatchDeserializer struct {
	sdk middleware.DeserializeMiddleware
}

func (*publishBatchDeserializer) ID() string { return deserializerID }

func (m *publishBatchDeserializer) HandleDeserialize(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (
	middleware.DeserializeOutput, middleware.Metadata, error,
) {
	out, metadata, err := next.HandleDeserialize(ctx, in)
	sent := answered{out: out, metadata: metadata, err: err}
	response, ok := out.RawResponse.(*smithyhttp.Response)
	if err != nil || !ok || response.StatusCode < 200 || response.StatusCode >= 300 || response.Body == nil {
		return m.sdk.HandleDeserialize(ctx, in, sent)
	}
	body := response.Body
	raw, readErr := io.ReadAll(io.LimitReader(body, maxFastResponseBytes+1))
	if readErr == nil && len(raw) <= maxFastResponseBytes {
		if output, ok := parsePublishBatchResponse(raw); ok {
			_ = body.Close()
			out.Result = output
			return out, metadata, nil
		}
	}
	// The SDK's deserializer reads the answer from its start: what was read
	// here, then the rest (a read error included).
	response.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(raw), readerOf(body, readErr)), body}
	return m.sdk.HandleDeserialize(ctx, in, sent)
}

// answered is a deserialize handler that answers what the call already
// got: the SDK's deserializer runs on the response without sending again.
type answered struct {
	out      middleware.DeserializeOutput
	metadata middleware.Metadata
	err      error
}

func (a answered) HandleDeserialize(context.Context, middleware.DeserializeInput) (middleware.DeserializeOutput, middleware.Metadata, error) {
	return a.out, a.metadata, a.err
}

// readerOf is what remains of body after a read that ended in err.
func readerOf(body io.Reader, err error) io.Reader {
	if err != nil {
		return errReader{err}
	}
	return body
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// xmlDeclaration is the only declaration the fast path reads: the one
// encoding/xml writes, which the SDK's decoder reads as it is.
const xmlDeclaration = `<?xml version="1.0" encoding="UTF-8"?>`

// parsePublishBatchResponse reads a PublishBatch answer written the way SNS
// writes it:
//
//	<PublishBatchResponse xmlns="..."><PublishBatchResult>
//	  <Successful><member><Id>…</Id><MessageId>…</MessageId></member>…</Successful>
//	  <Failed><member><Id>…</Id><Code>…</Code><Message>…</Message><SenderFault>true</SenderFault></member>…</Failed>
//	</PublishBatchResult>…
//
// with whitespace between elements, empty or self-closing elements, and
// anything after </PublishBatchResult> left unread, as the SDK leaves it.
// Text is plain printable ASCII with no markup characters (no entity, so
// no decoding to do). Anything else (another element, an attribute below
// the root, a comment, CDATA, an entity, a byte outside that set, a
// SenderFault other than true or false) is not read (ok false) and goes to
// the SDK's deserializer, which reads the whole language.
func parsePublishBatchResponse(b []byte) (_ *sns.PublishBatchOutput, ok bool) {
	p := xmlScanner{b: b}
	p.literal(xmlDeclaration) // only first, where XML allows it
	p.space()
	if !p.rootStart("PublishBatchResponse") {
		return nil, false
	}
	p.space()
	if !p.literal("<PublishBatchResult>") {
		return nil, false
	}
	output := &sns.PublishBatchOutput{}
	for {
		p.space()
		switch {
		case p.literal("</PublishBatchResult>"):
			return output, true
		case p.literal("<Successful/>"):
			if output.Successful == nil {
				output.Successful = []types.PublishBatchResultEntry{}
			}
		case p.literal("<Successful>"):
			if output.Successful == nil {
				output.Successful = []types.PublishBatchResultEntry{}
			}
			for !p.closing("</Successful>") {
				var e types.PublishBatchResultEntry
				if !p.member(func(name string, v *string) bool {
					switch name {
					case "Id":
						e.Id = v
					case "MessageId":
						e.MessageId = v
					case "SequenceNumber":
						e.SequenceNumber = v
					default:
						return false
					}
					return true
				}) {
					return nil, false
				}
				output.Successful = append(output.Successful, e)
			}
		case p.literal("<Failed/>"):
			if output.Failed == nil {
				output.Failed = []types.BatchResultErrorEntry{}
			}
		case p.literal("<Failed>"):
			if output.Failed == nil {
				output.Failed = []types.BatchResultErrorEntry{}
			}
			for !p.closing("</Failed>") {
				var e types.BatchResultErrorEntry
				if !p.member(func(name string, v *string) bool {
					switch name {
					case "Id":
						e.Id = v
					case "Code":
						e.Code = v
					case "Message":
						e.Message = v
					case "SenderFault":
						switch *v {
						case "true":
							e.SenderFault = true
						case "false":
							e.SenderFault = false
						default:
							return false
						}
					default:
						return false
					}
					return true
				}) {
					return nil, false
				}
				output.Failed = append(output.Failed, e)
			}
		default:
			return nil, false
		}
		if p.failed {
			return nil, false
		}
	}
}

// xmlScanner reads the subset of XML parsePublishBatchResponse accepts;
// failed is set by whatever it meets outside that subset.
type xmlScanner struct {
	b      []byte
	i      int
	failed bool
}

func (p *xmlScanner) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n') {
		p.i++
	}
}

func (p *xmlScanner) literal(s string) bool {
	if bytes.HasPrefix(p.b[p.i:], []byte(s)) {
		p.i += len(s)
		return true
	}
	return false
}

// closing reports whether the list ends here (after whitespace), consuming
// its end tag; anything but the end tag or a <member> fails the scan.
func (p *xmlScanner) closing(end string) bool {
	p.space()
	if p.literal(end) {
		return true
	}
	if !bytes.HasPrefix(p.b[p.i:], []byte("<member>")) {
		p.failed = true
		return true
	}
	return false
}

// rootStart reads the root's start tag: its name, then attributes of
// plain names and quoted values without markup.
func (p *xmlScanner) rootStart(name string) bool {
	if !p.literal("<" + name) {
		return false
	}
	for {
		start := p.i
		p.space()
		if p.literal(">") {
			return true
		}
		if p.i == start { // an attribute must follow whitespace
			return false
		}
		n := p.i
		for p.i < len(p.b) && isNameByte(p.b[p.i]) {
			p.i++
		}
		if p.i == n || !p.literal("=") || p.i >= len(p.b) || p.b[p.i] != '"' {
			return false
		}
		p.i++
		for p.i < len(p.b) && p.b[p.i] != '"' {
			if !isTextByte(p.b[p.i]) {
				return false
			}
			p.i++
		}
		if !p.literal(`"`) {
			return false
		}
	}
}

// member reads one <member>…</member> of simple fields, handing each
// field's text to set (false: a field it does not know).
func (p *xmlScanner) member(set func(name string, text *string) bool) bool {
	if !p.literal("<member>") {
		return false
	}
	for {
		p.space()
		if p.literal("</member>") {
			return true
		}
		if !p.literal("<") {
			return false
		}
		n := p.i
		for p.i < len(p.b) && isNameByte(p.b[p.i]) {
			p.i++
		}
		name := string(p.b[n:p.i])
		if name == "" {
			return false
		}
		var text string
		switch {
		case p.literal("/>"):
		case p.literal(">"):
			t := p.i
			for p.i < len(p.b) && isTextByte(p.b[p.i]) {
				p.i++
			}
			text = string(p.b[t:p.i])
			if !p.literal("</" + name + ">") {
				return false
			}
		default:
			return false
		}
		if !set(name, &text) {
			return false
		}
	}
}

// isNameByte is a byte of the element and attribute names the fast path
// reads: ASCII letters and digits (no namespace prefix).
func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// isTextByte is a byte of the text the fast path reads: printable ASCII
// and the space, without the characters that are markup (<, &, >: no
// entity to decode, no "]]>" for the decoder to refuse) or that the SDK's
// decoder would normalise (\r).
func isTextByte(c byte) bool {
	return c >= ' ' && c < 0x7f && c != '<' && c != '&' && c != '>'
}
