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
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/metricsfn"
)

func main() {
	handler.TuneCollector(config.OS())
	handler.TuneScheduler(config.OS())
	cfg, err := config.LoadMetrics(config.OS())
	if err != nil {
		handler.FailInit("metrics", err)
	}
	h, closeFn, err := metricsfn.New(context.Background(), cfg, handler.Deps{})
	if err != nil {
		handler.FailInit("metrics", err)
	}
	// Start never returns, so a deferred close would never run. With an
	// extension registered (WithEnableSIGTERM registers one) Lambda sends
	// SIGTERM before it ends the environment: the pool's sessions then end
	// with a Terminate message, not a dropped connection the database
	// counts as abandoned, and the process exits rather than wait for
	// SIGKILL.
	lambda.StartWithOptions(h.Handle, lambda.WithEnableSIGTERM(func() {
		closeFn()
		os.Exit(0)
	}))
}
