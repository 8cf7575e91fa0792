package webhook

import (
	"errors"
	"net/http"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outboxkit/dispatcher/shared/backoff"
	"github.com/outboxkit/dispatcher/shared/publish"
)

// FuzzClassifyResponse throws arbitrary statuses, Retry-After and Location
// headers and bodies at the one function that maps answers: it must never
// panic, always give one valid outcome that agrees with the status class,
// and keep what it quotes from the body bounded and printable.
func FuzzClassifyResponse(f *testing.F) {
	f.Add(200, "", "", []byte(`{"ok":true}`))
	f.Add(429, "120", "", []byte("slow down"))
	f.Add(503, "Wed, 21 Oct 2015 07:28:00 GMT", "", []byte("<html>down</html>"))
	f.Add(301, "", "https://elsewhere.example/\x00hook", []byte{})
	f.Add(500, "-1", "", []byte{0xff, 0xfe, '\n', 0x1b})
	f.Add(-7, "99999999999999999999999", "", []byte("weird"))
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, status int, retryAfterValue, location string, body []byte) {
		header := http.Header{}
		header.Set("Retry-After", retryAfterValue)
		header.Set("Location", location)
		head, truncated := body, false
		if len(head) > snippetBytes {
			head, truncated = head[:snippetBytes], true
		}
		r := classifyResponse(status, header, head, truncated, now)

		switch r.Kind {
		case publish.Delivered:
			if status < 200 || status > 299 || r.TargetRef == "" || r.Err != nil || r.Code != "" {
				t.Fatalf("status %d: delivered %+v", status, r)
			}
			return
		case publish.Retryable, publish.Terminal:
		default:
			t.Fatalf("status %d: kind %v", status, r.Kind)
		}
		if status >= 200 && status <= 299 {
			t.Fatalf("status %d not delivered: %+v", status, r)
		}
		if r.Code == "" || r.Err == nil {
			t.Fatalf("status %d: %s without a code or an error: %+v", status, r.Kind, r)
		}
		if r.RetryAfter < 0 || r.RetryAfter > backoff.MaxRetryAfter || (r.Kind == publish.Terminal && r.RetryAfter != 0) {
			t.Fatalf("status %d, Retry-After %q: retry after %s", status, retryAfterValue, r.RetryAfter)
		}
		var se *StatusError
		if !errors.As(r.Err, &se) || se.StatusCode != status {
			t.Fatalf("status %d: error %v", status, r.Err)
		}
		for _, quoted := range []string{se.Body, se.Location} {
			if len(quoted) > snippetBytes || !utf8.ValidString(quoted) {
				t.Fatalf("snippet of %d bytes, valid UTF-8 %t", len(quoted), utf8.ValidString(quoted))
			}
			for _, c := range quoted {
				if !unicode.IsPrint(c) && c != ' ' {
					t.Fatalf("snippet keeps %U", c)
				}
			}
		}
		_ = r.Err.Error()
	})
}
