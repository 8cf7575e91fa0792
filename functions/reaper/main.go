// Command reaper is the scheduled reaper function: it requeues messages whose
// lease expired, a dispatcher having crashed or overrun, and purges attempts
// and dedupe keys past their retention.
//
// Wiring only: the configuration is read and validated, the pool and clients
// built once per cold start, then the runtime takes over.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/outboxkit/dispatcher/shared/handler"
)

func main() {
	h, closeFn, err := handler.NewReaper(context.Background(), handler.OSEnv())
	if err != nil {
		handler.FailInit("reaper", err)
	}
	defer closeFn()
	lambda.Start(h.Handle)
}
