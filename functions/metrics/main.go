// Command metrics is the scheduled metrics exporter: it reads outbox.stats()
// and writes queue depth, age, expired leases and dead letters as CloudWatch
// Embedded Metric Format documents.
//
// Wiring only: the configuration is read from the environment and
// validated, the pool and clients built once per cold start, then the
// runtime takes over.
package main

import (
	"context"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/handler"
)

func main() {
	cfg, err := config.LoadMetrics(config.OS())
	if err != nil {
		handler.FailInit("metrics", err)
	}
	h, closeFn, err := handler.NewMetrics(context.Background(), cfg, handler.Deps{})
	if err != nil {
		handler.FailInit("metrics", err)
	}
	defer closeFn()
	lambda.Start(h.Handle)
}
