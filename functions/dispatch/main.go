// Command dispatch is the scheduled dispatch function: each invocation claims
// leased batches from the outbox and delivers them to their routes' targets
// (DESIGN.md §4).
//
// Wiring only: the configuration is read and validated, the pool and clients
// built once per cold start, then the runtime takes over.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
)

func main() {
	h, closeFn, err := dispatchfn.New(context.Background(), handler.OSEnv())
	if err != nil {
		handler.FailInit("dispatch", err)
	}
	defer closeFn()
	lambda.Start(h.Handle)
}
