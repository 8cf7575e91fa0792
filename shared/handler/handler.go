// Package handler holds what the Lambda functions share — the per-process
// Runtime (logs, cold start, tracing, metrics), strict event decoding, the
// cold-start wiring from the typed configuration the config package reads
// from the environment. Each function's handler is a package of its own
// below it: dispatchfn, reaperfn, replayfn, metricsfn, so that a function
// links only what it runs (the reaper none of the publishers and their SDK
// clients). Each handler takes the raw invocation event, validates it (a
// malformed event gets an *EventError and changes nothing), does one
// bounded piece of work and answers a JSON summary (docs/ARCHITECTURE.md).
//
// The functions' main packages only wire these up; the operator CLI runs the
// same handlers in-process.
package handler

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/aws/aws-lambda-go/lambdacontext"
)

// WorkerID names one invocation: the prefix and the Lambda request id, or a
// random suffix outside Lambda.
func WorkerID(ctx context.Context, prefix string) string {
	if prefix == "" {
		prefix = "worker"
	}
	if lc, ok := lambdacontext.FromContext(ctx); ok && lc.AwsRequestID != "" {
		return prefix + ":" + lc.AwsRequestID
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + ":" + hex.EncodeToString(b[:])
}
