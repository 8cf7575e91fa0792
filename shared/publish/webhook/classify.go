package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/outboxtype"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// StatusError is a non-2xx answer: the error of every result classified
// from an HTTP status.
type StatusError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Body is the start of the response body, reduced to printable text and
	// at most 512 bytes ("…" ends it when the body was longer).
	Body string
	// Location is a redirect's target (3xx only), reduced the same way.
	Location string
}

func (e *StatusError) Error() string {
	var b strings.Builder
	b.WriteString("HTTP ")
	b.WriteString(strconv.Itoa(e.StatusCode))
	if text := http.StatusText(e.StatusCode); text != "" {
		b.WriteByte(' ')
		b.WriteString(text)
	}
	if e.StatusCode >= 300 && e.StatusCode <= 399 {
		b.WriteString(": redirects are not followed")
		if e.Location != "" {
			b.WriteString(" (Location: ")
			b.WriteString(e.Location)
			b.WriteByte(')')
		}
	}
	if e.Body != "" {
		b.WriteString(": ")
		b.WriteString(e.Body)
	}
	return b.String()
}

// classifyResponse is the one place where an HTTP answer becomes a Result
// (the table is in the package doc). head is the start of the body and
// truncated says whether there was more; now dates an HTTP-date Retry-After.
func classifyResponse(status int, header http.Header, head []byte, truncated bool, now time.Time) publish.Result {
	if status >= 200 && status <= 299 {
		return publish.Ok("HTTP " + strconv.Itoa(status))
	}
	err := &StatusError{StatusCode: status, Body: snippet(head, truncated)}
	switch {
	case status == http.StatusRequestTimeout:
		return publish.Retry(outboxtype.CodeTimeout, err, retryAfter(header, now))
	case status == http.StatusTooManyRequests:
		return publish.Retry(outboxtype.CodeThrottled, err, retryAfter(header, now))
	case status == http.StatusTooEarly, status >= 500 && status <= 599:
		return publish.Retry(outboxtype.CodeTarget5xx, err, retryAfter(header, now))
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return publish.Fail(outboxtype.CodeAccessDenied, err)
	case status == http.StatusNotFound, status == http.StatusGone:
		return publish.Fail(outboxtype.CodeTargetNotFound, err)
	case status >= 400 && status <= 499:
		return publish.Fail(outboxtype.CodeTargetRejected, err)
	case status >= 300 && status <= 399:
		err.Location = snippet([]byte(header.Get("Location")), false)
		return publish.Fail(outboxtype.CodeTargetRejected, err)
	}
	// 1xx reaching us, or a code outside HTTP's range: something between us
	// and the receiver misbehaved; nothing says the message was refused.
	return publish.Retry(outboxtype.CodeTarget5xx, err, 0)
}

// retryAfter reads a Retry-After header, delta-seconds or an HTTP-date
// (RFC 9110, section 10.2.3), as a wait from now: 0 when absent, malformed
// or in the past, and never more than backoff.MaxRetryAfter, so a bogus header
// cannot park a message for a year.
func retryAfter(header http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(header.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			var numErr *strconv.NumError
			if errors.As(err, &numErr) && errors.Is(numErr.Err, strconv.ErrRange) {
				return backoff.MaxRetryAfter
			}
			return 0
		}
		if secs >= uint64(backoff.MaxRetryAfter/time.Second) {
			return backoff.MaxRetryAfter
		}
		return time.Duration(secs) * time.Second
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	return min(max(at.Sub(now), 0), backoff.MaxRetryAfter)
}

// snippet reduces untrusted bytes to at most snippetBytes of printable,
// valid UTF-8 on one line: runs of whitespace become one space, invalid
// bytes and other non-printable runes U+FFFD, and "…" marks a cut.
func snippet(b []byte, truncated bool) string {
	const ellipsis = "…"
	limit := snippetBytes - len(ellipsis)
	var out strings.Builder
	out.Grow(min(len(b), snippetBytes))
	space := false
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		if unicode.IsSpace(r) {
			space = out.Len() > 0
			continue
		}
		if (r == utf8.RuneError && size == 1) || !unicode.IsPrint(r) {
			r = utf8.RuneError
		}
		need := utf8.RuneLen(r)
		if space {
			need++
		}
		if out.Len()+need > limit {
			truncated = true
			break
		}
		if space {
			out.WriteByte(' ')
			space = false
		}
		out.WriteRune(r)
	}
	if truncated {
		out.WriteString(ellipsis)
	}
	return out.String()
}

// classifyTransportError is the one place where a request that got no
// answer becomes a Result. parent is Publish's context: its end is the
// caller's, not the request timeout's.
func (p *Publisher) classifyTransportError(parent context.Context, err error) publish.Result {
	// url.Error repeats the full URL, query and all; name the target our way.
	cause := err
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		cause = urlErr.Err
	}
	if r, ok := publish.ContextResult(parent, cause); ok {
		if r.Code == outboxtype.CodeTimeout {
			r.Err = p.errorf("no answer within %s: %w", p.timeout, cause)
		} else {
			r.Err = p.errorf("%w", r.Err)
		}
		return r
	}
	if isCertificateError(cause) {
		return publish.Retry(outboxtype.CodeNetwork, p.errorf("the target's TLS certificate was rejected: %w", cause), 0)
	}
	return publish.Retry(outboxtype.CodeNetwork, p.errorf("%w", cause), 0)
}

// isCertificateError reports whether err is the dispatcher refusing the
// target's certificate (as opposed to the connection failing).
func isCertificateError(err error) bool {
	var (
		verifyErr   *tls.CertificateVerificationError
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalidErr  x509.CertificateInvalidError
	)
	return errors.As(err, &verifyErr) || errors.As(err, &unknownAuth) ||
		errors.As(err, &hostErr) || errors.As(err, &invalidErr)
}
