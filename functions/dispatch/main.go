// Command dispatch is the scheduled dispatch function: each invocation claims
// leased batches from the outbox and delivers them to their routes' targets
// (DESIGN.md §4).
//
// Wiring only: the configuration is read from the environment and
// validated, the pool and clients built once per cold start, then the
// runtime takes over.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
)

func main() {
	cfg, err := dispatchconfig.Load(config.OS())
	if err != nil {
		handler.FailInit("dispatch", err)
	}
	h, closeFn, err := dispatchfn.New(context.Background(), cfg, handler.Deps{})
	if err != nil {
		handler.FailInit("dispatch", err)
	}
	defer closeFn()
	lambda.Start(h.Handle)
}
