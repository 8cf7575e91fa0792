package publishers

import (
	"bytes"
	"io"
	"net/http"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
)

// awsWriteBufferBytes is each AWS connection's write buffer, and the
// largest request body awsHTTPClient hands net/http in memory: a request up
// to this size, headers and body together, goes out in one write.
const awsWriteBufferBytes = 64 << 10

// awsHTTPClient is the HTTP client of every AWS SDK client the publishers
// use: enough idle connections per host for every call in flight (the
// default of 2 would make each burst reconnect), and each request, up to
// awsWriteBufferBytes, in one write to its connection (wholeBodies).
func awsHTTPClient(inFlight int) *wholeBodies {
	return &wholeBodies{next: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConns = max(256, 2*inFlight)
		t.MaxIdleConnsPerHost = max(64, inFlight)
		t.IdleConnTimeout = 90 * time.Second
		t.WriteBufferSize = awsWriteBufferBytes
	})}
}

// wholeBodies hands net/http each request body of known length up to
// awsWriteBufferBytes as a *bytes.Reader. The SDK wraps its bodies in a
// reader of its own, which net/http cannot tell is in memory: it then
// writes the headers to the connection before the body, in case the body
// waits on the server, and with its buffer of 4 KiB a PutEvents call of
// ten entries took two or three writes, each a system call and a TCP
// segment out of the function's CPU share. With the body in memory and a
// buffer that holds it, the request goes out in one. The body is copied
// once (SigV4 has already hashed it); the SDK builds a new request and
// rewinds its stream for each attempt, so a retry is unaffected.
type wholeBodies struct {
	next *awshttp.BuildableClient
}

func (c *wholeBodies) Do(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody && req.ContentLength > 0 && req.ContentLength <= awsWriteBufferBytes {
		body := make([]byte, req.ContentLength)
		_, err := io.ReadFull(req.Body, body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	return c.next.Do(req)
}
