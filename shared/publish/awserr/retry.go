package awserr

import (
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
)

// The SDK retryer of every AWS publisher's client (NewRetryer).
const (
	// RetryMaxAttempts is the SDK's attempts per call, the first included.
	// One quick retry absorbs a blip (a connection reset on a reused
	// connection, one throttle); anything longer is the outbox's job, with
	// its own backoff, its own attempt count and the invocation's deadline
	// in view.
	RetryMaxAttempts = 2
	// RetryMaxBackoff caps the SDK's wait before its retry, well inside a
	// call's timeout. The wait is drawn uniformly from [0, RetryMaxBackoff)
	// (full jitter), so that the retries of calls throttled together spread
	// out; the SDK's own backoff would wait exactly the cap this short.
	RetryMaxBackoff = 500 * time.Millisecond
)

// NewRetryer returns the retryer the AWS publishers' clients use: at most
// RetryMaxAttempts attempts, jittered waits below RetryMaxBackoff, and no
// retry quota. The SDK's standard retryer spends a quota of 500 tokens, 5 a
// retry, that only successes refill: after about 100 failed calls in a row
// it stops retrying at all, so that in one bad minute calls that would have
// succeeded on their retry fail fast, and the outbox retries them a backoff
// later instead. It is an aws.Config's Retryer as it is.
func NewRetryer() aws.Retryer {
	return retry.NewStandard(func(so *retry.StandardOptions) {
		so.MaxAttempts = RetryMaxAttempts
		so.MaxBackoff = RetryMaxBackoff
		so.Backoff = fullJitter(RetryMaxBackoff)
		so.RateLimiter = ratelimit.None
	})
}

// fullJitter is the retryer's backoff: a uniformly random wait below the
// duration.
type fullJitter time.Duration

func (j fullJitter) BackoffDelay(int, error) (time.Duration, error) {
	return time.Duration(rand.Int64N(int64(j))), nil
}
