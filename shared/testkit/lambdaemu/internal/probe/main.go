// Command probe is a tiny Lambda function for the emulator's own tests:
// it reports which environment ran it and how many invocations that
// environment has run (environment reuse), and on request sleeps, prints,
// fails, exits, or invokes another function through the real SDK client
// (which reaches the emulator through AWS_ENDPOINT_URL_LAMBDA).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
)

// Event says what the probe does, in this order: print, sleep, spin,
// invoke, fail, exit.
type Event struct {
	Print   []string `json:"print,omitempty"`
	SleepMS int      `json:"sleep_ms,omitempty"`
	// SpinCPUMS burns this much of the process's CPU time in a busy loop
	// (CPU time, not wall time: under a CPU cap it takes longer).
	SpinCPUMS int    `json:"spin_cpu_ms,omitempty"`
	Invoke    *Call  `json:"invoke,omitempty"`
	Fail      string `json:"fail,omitempty"`
	Exit      *int   `json:"exit,omitempty"`
}

// Call is an Invoke of another function.
type Call struct {
	Function string          `json:"function"`
	Type     string          `json:"type,omitempty"` // RequestResponse (default) or Event
	Payload  json.RawMessage `json:"payload,omitempty"`
}

// Answer is the probe's response.
type Answer struct {
	PID         int    `json:"pid"`
	Invocations int64  `json:"invocations"`
	RequestID   string `json:"request_id"`
	// SpunCPUMS and SpunWallMS are the CPU and wall time the spin took.
	SpunCPUMS  float64 `json:"spun_cpu_ms,omitempty"`
	SpunWallMS float64 `json:"spun_wall_ms,omitempty"`
	// Invoked is the answer to Event.Invoke.
	Invoked *Invoked `json:"invoked,omitempty"`
}

// Invoked is what the SDK call returned.
type Invoked struct {
	StatusCode    int32           `json:"status_code"`
	FunctionError string          `json:"function_error,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	Error         string          `json:"error,omitempty"`
}

var (
	invocations atomic.Int64
	client      *awslambda.Client
)

func handle(ctx context.Context, ev Event) (Answer, error) {
	a := Answer{PID: os.Getpid(), Invocations: invocations.Add(1)}
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		a.RequestID = lc.AwsRequestID
	}
	for _, line := range ev.Print {
		fmt.Println(line)
	}
	if ev.SleepMS > 0 {
		time.Sleep(time.Duration(ev.SleepMS) * time.Millisecond)
	}
	if ev.SpinCPUMS > 0 {
		a.SpunCPUMS, a.SpunWallMS = spin(time.Duration(ev.SpinCPUMS) * time.Millisecond)
	}
	if c := ev.Invoke; c != nil {
		in := &awslambda.InvokeInput{FunctionName: aws.String(c.Function), Payload: c.Payload}
		if c.Type == "Event" {
			in.InvocationType = types.InvocationTypeEvent
		}
		out, err := client.Invoke(ctx, in)
		a.Invoked = &Invoked{}
		if err != nil {
			a.Invoked.Error = err.Error()
		} else {
			a.Invoked.StatusCode, a.Invoked.FunctionError = out.StatusCode, aws.ToString(out.FunctionError)
			if json.Valid(out.Payload) {
				a.Invoked.Payload = out.Payload
			}
		}
	}
	if ev.Fail != "" {
		return a, errors.New(ev.Fail)
	}
	if ev.Exit != nil {
		os.Exit(*ev.Exit)
	}
	return a, nil
}

// spin burns budget of the process's CPU time.
func spin(budget time.Duration) (cpuMS, wallMS float64) {
	start, cpu0 := time.Now(), cpuTime()
	x := uint64(1)
	for cpuTime()-cpu0 < budget {
		for i := 0; i < 10000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink.Store(x)
	return float64(cpuTime()-cpu0) / 1e6, float64(time.Since(start)) / 1e6
}

var sink atomic.Uint64

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe: load the AWS configuration:", err)
		os.Exit(1)
	}
	client = awslambda.NewFromConfig(cfg)
	lambda.Start(handle)
}
