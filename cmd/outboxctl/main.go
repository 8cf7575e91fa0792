// Command outboxctl operates the outbox: migrations now; status, dead
// letters, replay, local invocation, a long-running dispatcher and a webhook
// sink as the project grows.
package main

import (
	"context"
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
		fmt.Fprintf(os.Stderr, "outboxctl: %s\n", oneLine(err))
		os.Exit(exitCode(err))
	}
}
