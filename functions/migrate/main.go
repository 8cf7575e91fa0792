// Command migrate is the migrate function: it applies the outbox
// migrations from inside the database's VPC, run by the stack's custom
// resource on every deployment that changes it, or invoked by hand
// (outboxctl invoke migrate, aws lambda invoke). See package migratefn.
//
// Wiring only; unlike the other functions, a bad configuration does not
// fail the cold start: a CloudFormation request must get its answer
// (FAILED, with the reason), or the stack waits an hour for it.
package main

import (
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/migratefn"
)

func main() {
	handler.TuneCollector(config.OS())
	handler.TuneScheduler(config.OS())
	cfg, err := config.LoadFunction(config.OS())
	h, closeFn := migratefn.New(cfg, err, handler.Deps{})
	// See functions/dispatch: SIGTERM closes the pool before the
	// environment ends.
	lambda.StartWithOptions(h.Handle, lambda.WithEnableSIGTERM(func() {
		closeFn()
		os.Exit(0)
	}))
}
