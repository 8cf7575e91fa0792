package handler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/configerr"
)

// ConfigError is a cold start that failed on its configuration; its type
// name is the errorType Lambda reports.
type ConfigError = configerr.Error

// FailInit reports a cold-start failure the way the Lambda Runtime API
// expects — POST /runtime/init/error, so that the invoker sees the message
// instead of a bare exit — logs it as one JSON line, and exits.
func FailInit(function string, err error) {
	cfgErr := &ConfigError{Subject: function, Err: err}
	line, _ := json.Marshal(map[string]any{
		"level": "ERROR", "message": "cold start failed", "service": function,
		"timestamp": time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		"error":     cfgErr.Error(),
	})
	fmt.Fprintln(os.Stdout, string(line))
	if api := config.LambdaRuntimeAPI(config.OS()); api != "" {
		body, _ := json.Marshal(map[string]string{"errorType": "ConfigError", "errorMessage": cfgErr.Error()})
		req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/2018-06-01/runtime/init/error", bytes.NewReader(body))
		req.Header.Set("Lambda-Runtime-Function-Error-Type", "ConfigError")
		client := &http.Client{Timeout: 2 * time.Second}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	os.Exit(1)
}

// InvocationError is an invocation that failed after its event was accepted
// (the database went away, say). Its type name is the errorType Lambda
// reports; what was done before the failure is in the logs and, for
// dispatch, in the partial summary logged with it.
type InvocationError struct {
	Function string
	Err      error
}

func (e *InvocationError) Error() string { return fmt.Sprintf("%s: %v", e.Function, e.Err) }

func (e *InvocationError) Unwrap() error { return e.Err }

// TuneCollector sets the process's garbage collector for its function's
// memory, once at cold start, before anything is loaded: the soft memory
// limit (config.MemoryLimit), so that the collector works harder as the
// heap nears the function's memory instead of letting Lambda end the
// invocation, and under it the pace (config.GCPercent), so that it runs a
// quarter as often while the heap is far from it. Outside Lambda it
// changes nothing, nor what GOMEMLIMIT or GOGC set.
func TuneCollector(env config.Env) {
	if limit := config.MemoryLimit(env); limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	if percent := config.GCPercent(env); percent > 0 {
		debug.SetGCPercent(percent)
	}
}

// TuneScheduler sets the processors the Go scheduler runs goroutines on
// to the vCPUs of time the function's memory buys (config.MaxProcs), once
// at cold start, never more than the runtime's default: one below
// 1,769 MB, where a second processor only hands goroutines between
// threads that the share runs one at a time. Outside Lambda it changes
// nothing, nor what GOMAXPROCS set.
func TuneScheduler(env config.Env) {
	if procs := config.MaxProcs(env); procs > 0 && procs < runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(procs)
	}
}

// collectorSettings are the collector's pace (GOGC; -1: off) and soft
// memory limit in MiB (0: none) as the runtime applies them, whichever of
// TuneCollector, GOGC and GOMEMLIMIT set them: the cold start logs them.
func collectorSettings() (gogc, memoryLimitMiB int64) {
	samples := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(samples)
	gogc, memoryLimitMiB = -1, 0
	if samples[0].Value.Kind() == metrics.KindUint64 {
		// GOGC=off reads as the largest uint64 (the runtime's -1).
		if v := samples[0].Value.Uint64(); v <= math.MaxInt32 {
			gogc = int64(v)
		}
	}
	if samples[1].Value.Kind() == metrics.KindUint64 {
		// No limit reads as the largest int64.
		if v := samples[1].Value.Uint64(); v < math.MaxInt64 {
			memoryLimitMiB = int64(v >> 20)
		}
	}
	return gogc, memoryLimitMiB
}
