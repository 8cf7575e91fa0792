// Command dispatch is the scheduled dispatch function: each invocation claims
// leased batches from the outbox and delivers them to their routes' targets
// (docs/ARCHITECTURE.md).
//
// Wiring only: the configuration is read from the environment and
// validated, the pool and clients built once per cold start, then the
// runtime takes over.
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/config/dispatchconfig"
	"github.com/outboxkit/dispatcher/shared/config/ssmparam"
	"github.com/outboxkit/dispatcher/shared/handler"
	"github.com/outboxkit/dispatcher/shared/handler/dispatchfn"
)

func main() {
	env := config.OS()
	handler.TuneCollector(env)
	handler.TuneScheduler(env)
	// Routes named by OUTBOX_ROUTES_SSM_PARAMETER are read here, once per
	// cold start; nothing loads the AWS configuration for it otherwise.
	env.ReadParameter = ssmparam.Reader(context.Background(), func(ctx context.Context) (aws.Config, error) {
		return awsconfig.LoadDefaultConfig(ctx)
	})
	cfg, err := dispatchconfig.Load(env)
	if err != nil {
		handler.FailInit("dispatch", err)
	}
	h, closeFn, err := dispatchfn.New(context.Background(), cfg, handler.Deps{})
	if err != nil {
		handler.FailInit("dispatch", err)
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
