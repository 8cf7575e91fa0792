// Command dlq-replay is the on-demand dead-letter replay function: a dry run
// (the default) lists the dead letters a filter selects; a real one moves
// them back to the queue, audited with an operator and a reason.
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
	"github.com/outboxkit/dispatcher/shared/handler/replayfn"
)

func main() {
	handler.TuneCollector(config.OS())
	handler.TuneScheduler(config.OS())
	cfg, err := config.LoadReplay(config.OS())
	if err != nil {
		handler.FailInit("dlq-replay", err)
	}
	h, closeFn, err := replayfn.New(context.Background(), cfg, handler.Deps{})
	if err != nil {
		handler.FailInit("dlq-replay", err)
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
