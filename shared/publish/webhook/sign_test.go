package webhook

import (
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The signer must write what the reference library's Sign writes, from
// any goroutine (its HMACs are pooled and reused).
func TestSignerMatchesTheReferenceLibrary(t *testing.T) {
	t.Parallel()
	key := []byte("a signing key of thirty-two byte")
	ref, _ := standardwebhooks.NewWebhookRaw(key)
	s := newSigner(key)
	cases := []struct {
		id   string
		at   time.Time
		body string
	}{
		{"msg_1", time.Unix(1735787045, 0), `{"a":1}`},
		{"", time.Unix(0, 0), ""},
		{strings.Repeat("k", 300), time.Unix(-5, 999), strings.Repeat("x", 100000)},
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for _, c := range cases {
				want, _ := ref.Sign(c.id, c.at, []byte(c.body))
				if got := s.Sign(c.id, c.at, []byte(c.body)); got != want {
					t.Errorf("Sign(%.20q, %d, %d bytes) = %q, the library's %q", c.id, c.at.Unix(), len(c.body), got, want)
				}
			}
		})
	}
	wg.Wait()
}
