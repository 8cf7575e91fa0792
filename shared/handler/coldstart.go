package handler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"time"

	"github.com/outboxkit/dispatcher/shared/config"
)

// ConfigError is a cold start that failed on its configuration; its type
// name is the errorType Lambda reports.
type ConfigError struct {
	Function string
	Err      error
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s: invalid configuration: %v", e.Function, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// FailInit reports a cold-start failure the way the Lambda Runtime API
// expects — POST /runtime/init/error, so that the invoker sees the message
// instead of a bare exit — logs it as one JSON line, and exits.
func FailInit(function string, err error) {
	cfgErr := &ConfigError{Function: function, Err: err}
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

// LimitMemory gives the process the soft memory limit its function's
// memory size calls for (config.MemoryLimit), once at cold start, before
// anything is loaded: the collector then works harder as the heap nears
// the function's memory instead of letting Lambda end the invocation.
// Outside Lambda, or with GOMEMLIMIT set, it changes nothing.
func LimitMemory(env config.Env) {
	if limit := config.MemoryLimit(env); limit > 0 {
		debug.SetMemoryLimit(limit)
	}
}
