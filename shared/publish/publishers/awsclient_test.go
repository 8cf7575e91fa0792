package publishers

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/eventbridgefake"
)

// writeCountingConn counts the writes made to a connection: each is a
// system call and, on a connection without Nagle's delay, a TCP segment.
type writeCountingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCountingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// A PutEvents call of ten entries goes out in one write: its signed
// headers and its body together. Before, net/http flushed the headers on
// their own (the SDK's body reader is not one it knows to be in memory)
// and its 4 KiB buffer split the body again: two or three writes a call.
// Every call is still answered, through the SDK's signing and retries,
// with its body intact.
func TestAWSRequestsGoOutInOneWrite(t *testing.T) {
	t.Parallel()
	fake := eventbridgefake.New(t)
	var writes atomic.Int64
	client := awsHTTPClient(8)
	client.next = client.next.WithTransportOptions(func(tr *http.Transport) {
		dial := (&net.Dialer{}).DialContext
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return writeCountingConn{Conn: c, writes: &writes}, nil
		}
	})
	eb := eventbridge.NewFromConfig(aws.Config{
		Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("k", "s", ""),
		HTTPClient: client, BaseEndpoint: aws.String(fake.URL()),
	})
	detail := `{"pad":"` + strings.Repeat("x", 500) + `"}`
	entries := make([]types.PutEventsRequestEntry, 10)
	for i := range entries {
		entries[i] = types.PutEventsRequestEntry{
			EventBusName: aws.String("default"), Source: aws.String("outbox.billing"),
			DetailType: aws.String("usage"), Detail: aws.String(detail),
		}
	}
	const calls = 5
	for range calls {
		out, err := eb.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: entries})
		if err != nil {
			t.Fatal(err)
		}
		if out.FailedEntryCount != 0 || len(out.Entries) != len(entries) {
			t.Fatalf("PutEvents answered %d failed of %d entries", out.FailedEntryCount, len(out.Entries))
		}
	}
	if got := len(fake.Received()); got != calls*len(entries) {
		t.Fatalf("the bus received %d entries, want %d", got, calls*len(entries))
	}
	if got := writes.Load(); got != calls {
		t.Errorf("%d writes for %d PutEvents calls of about 7 KiB, want one a call", got, calls)
	}
}

// Bodies at the buffer's size and beyond it, the latter passed to
// net/http as the SDK gave it, reach the server whole.
func TestAWSRequestBodiesAtAndBeyondTheBufferArriveWhole(t *testing.T) {
	t.Parallel()
	var received []int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		received = append(received, len(b))
	}))
	t.Cleanup(srv.Close)
	client := awsHTTPClient(1)
	for _, size := range []int{awsWriteBufferBytes, awsWriteBufferBytes + 1} {
		// Wrapped, so that net/http cannot tell it is in memory, as the
		// SDK's own reader.
		body := struct{ io.Reader }{strings.NewReader(strings.Repeat("b", size))}
		req, err := http.NewRequest(http.MethodPost, srv.URL, body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(size)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if want := []int{awsWriteBufferBytes, awsWriteBufferBytes + 1}; !slices.Equal(received, want) {
		t.Errorf("the server read bodies of %v bytes, want %v", received, want)
	}
}
