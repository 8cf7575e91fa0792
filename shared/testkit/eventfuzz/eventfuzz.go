// Package eventfuzz holds what the Lambda functions' event fuzz targets
// share: the seed events every parser sees and the check that a refusal is
// an *handler.EventError naming its function.
package eventfuzz

import (
	"errors"
	"testing"

	"github.com/outboxkit/dispatcher/shared/handler"
)

// Seeds are shapes every event parser sees: the events/ samples,
// an EventBridge envelope, and the malformations that matter.
var Seeds = []string{
	``, `null`, `{}`, ` {} `, `[]`, `"x"`, `1`, `{`, `{}{}`, `{} x`, `nul`,
	`{"detail-type":"Scheduled Event","source":"aws.events","detail":{}}`,
	`{"version":"0","id":"53dc4d37","detail-type":"Scheduled Event","source":"aws.events","account":"123456789012","time":"2026-11-21T03:00:00Z","region":"eu-west-1","resources":["arn:aws:events:eu-west-1:123456789012:rule/x"],"detail":{}}`,
	`{"detail-type":"Scheduled Event","detail":null}`,
	`{"detail-type":"Scheduled Event","detail":"{}"}`,
	`{"detail-type":"Scheduled Event","detail":{"detail-type":"nested","detail":{}}}`,
	`{"detail-type":"x","extra":1}`,
	`{"Detail-Type":"x"}`,
	`{"unknown":1}`,
	"{\"a\":\"\xff\"}",
}

// MustBeEventError fails t unless err is an *handler.EventError of function
// with a problem: its type name is Lambda's errorType, and it means
// "nothing was changed".
func MustBeEventError(t testing.TB, function string, err error) {
	t.Helper()
	var ee *handler.EventError
	if !errors.As(err, &ee) {
		t.Fatalf("refused with %T (%v), want *handler.EventError", err, err)
	}
	if ee.Function != function || ee.Problem == "" {
		t.Fatalf("EventError %+v: want function %q and a problem", ee, function)
	}
}
