// Command outboxctl operates the outbox and runs it locally:
//
//	migrate up|down|status   the schema
//	enqueue                  messages from flags or JSON lines, in one transaction
//	status [--watch]         the queue per namespace/topic: depth, age, leases, dead
//	dead list|show           dead letters, a message's payload and attempt history
//	replay                   dead letters back to the queue (dry run unless --yes)
//	invoke FUNCTION          a Lambda function's handler, in-process
//	serve                    a long-lived dispatcher woken by LISTEN/NOTIFY
//	sink                     a local plugin endpoint that verifies and deduplicates
//	demo                     the whole data path on this machine (make run)
//	version                  the module version and VCS revision of this build
//
// Usage errors exit 2 and other failures 1, each with a one-line reason on
// stderr (a configuration with several problems has one line each). SIGINT and SIGTERM cancel the command's context: serve finishes
// its batch, status --watch and sink stop cleanly.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCommand()
	if err := root.ExecuteContext(ctx); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// Interrupted mid-way: say so rather than "context canceled".
			fmt.Fprintln(os.Stderr, "outboxctl: interrupted")
			os.Exit(130)
		}
		printError(os.Stderr, err)
		os.Exit(exitCode(err))
	}
}
