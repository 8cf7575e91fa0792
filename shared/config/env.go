package config

import (
	"errors"
	"os"
	"strconv"
)

// Env is where a configuration is read from: the process's in production
// (OS), a map in tests, or the CLI's with its flags applied.
type Env struct {
	// Getenv returns a variable's value, "" when unset. Nil: no variable is
	// set.
	Getenv func(string) string
	// ReadFile reads OUTBOX_ROUTES_FILE. Nil: os.ReadFile.
	ReadFile func(string) ([]byte, error)
	// ReadParameter reads the SSM parameter OUTBOX_ROUTES_SSM_PARAMETER
	// names (package ssmparam builds one). Nil: parameters cannot be read
	// here, and naming one is an error.
	ReadParameter func(name string) (string, error)
	// DatabaseURLSetting is what messages call the database URL when it
	// came from elsewhere than OUTBOX_DATABASE_URL (outboxctl's
	// --database-url), so that an error names what the operator typed.
	// "": OUTBOX_DATABASE_URL.
	DatabaseURLSetting string
}

// OS is the process's environment.
func OS() Env { return Env{Getenv: os.Getenv, ReadFile: os.ReadFile} }

// Get is a variable's value as it is, "" when unset.
func (e Env) Get(name string) string { return e.getenv()(name) }

// Read reads a file the configuration names (OUTBOX_ROUTES_FILE's).
func (e Env) Read(path string) ([]byte, error) { return e.readFile()(path) }

// Parameter reads an SSM parameter the configuration names
// (OUTBOX_ROUTES_SSM_PARAMETER's).
func (e Env) Parameter(name string) (string, error) {
	if e.ReadParameter == nil {
		return "", errNoParameterStore
	}
	return e.ReadParameter(name)
}

var errNoParameterStore = errors.New("nothing reads SSM parameters in this process")

func (e Env) getenv() func(string) string {
	if e.Getenv == nil {
		return func(string) string { return "" }
	}
	return e.Getenv
}

func (e Env) readFile() func(string) ([]byte, error) {
	if e.ReadFile == nil {
		return os.ReadFile
	}
	return e.ReadFile
}

// WithDatabaseURL is e with url as the database, replacing every database
// source e names (outboxctl's --database-url); "" leaves e as it is. Set
// DatabaseURLSetting to have messages name the URL's source.
func (e Env) WithDatabaseURL(url string) Env {
	if url == "" {
		return e
	}
	getenv := e.getenv()
	e.Getenv = func(name string) string {
		switch name {
		case "OUTBOX_DATABASE_URL":
			return url
		case "OUTBOX_DB_SECRET_ARN", "OUTBOX_DB_IAM_AUTH":
			return ""
		}
		return getenv(name)
	}
	return e
}

// LambdaRuntimeAPI is the address of the Lambda Runtime API, "" outside
// Lambda: a failed cold start reports its error there.
func LambdaRuntimeAPI(env Env) string { return env.getenv()("AWS_LAMBDA_RUNTIME_API") }

// MemoryLimit is the soft limit a function's Go runtime should keep its
// memory under (runtime/debug.SetMemoryLimit), in bytes: four fifths of
// the function's memory size (AWS_LAMBDA_FUNCTION_MEMORY_SIZE), the rest
// left to what the Go runtime does not manage (the binary's pages, the
// kernel's buffers). It is 0, none, outside Lambda and when GOMEMLIMIT is
// set: the runtime applied that one itself at start.
//
// Without a limit the collector lets the heap grow to twice what is live,
// whatever the function's memory: batches of payloads near a route's limit,
// within the claim's byte budget (OUTBOX_BATCH_MAX_BYTES), then need twice
// their size. Before this limit (and before the dispatcher let go of
// published payloads and request bodies) the dispatch function peaked at
// 421 MiB in a function of 256 MB, which Lambda ends as out of memory with
// the batch's leases left to expire; with all three, about 220 MiB
// (TestPayloadsNearTheRoutesLimitKeepTheFunctionWithinItsMemory).
func MemoryLimit(env Env) int64 {
	getenv := env.getenv()
	if getenv("GOMEMLIMIT") != "" {
		return 0
	}
	mb, err := strconv.ParseInt(getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"), 10, 64)
	if err != nil || mb <= 0 {
		return 0
	}
	return mb << 20 * 4 / 5
}

// LambdaFullCPUMemoryMB is the memory size at which Lambda gives a function
// one full vCPU of time; below it, a share in proportion to its memory
// (256 MB: 14.5% of one CPU), above it, in proportion again up to six.
const LambdaFullCPUMemoryMB = 1769

// MaxProcs is the processors a function's Go scheduler should run
// goroutines on (runtime.GOMAXPROCS): the vCPUs of time its memory size
// buys (AWS_LAMBDA_FUNCTION_MEMORY_SIZE ÷ LambdaFullCPUMemoryMB, rounded
// up), so 1 below 1,769 MB. Lambda shows a function two vCPUs or more
// whatever its share, and the runtime's default (the CPUs it sees, at
// least 2 under a CPU quota) then keeps a second processor that the share
// never lets run beside the first: every goroutine made runnable wakes an
// idle thread to take it, a futex wake and a context switch paid out of the
// same share. A dispatch invocation at 256 MB's share spent 7-10% less
// CPU per message to EventBridge with one (docs/PERFORMANCE.md, "The
// functions' runtime"). It is 0, leave the runtime's default, outside
// Lambda and when GOMAXPROCS is set: the runtime applied that one itself
// at start.
func MaxProcs(env Env) int {
	getenv := env.getenv()
	if getenv("GOMAXPROCS") != "" {
		return 0
	}
	mb, err := strconv.ParseInt(getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"), 10, 64)
	if err != nil || mb <= 0 {
		return 0
	}
	return int((mb + LambdaFullCPUMemoryMB - 1) / LambdaFullCPUMemoryMB)
}

// FunctionGCPercent is the collector's pace inside a function (GOGC): the
// heap may grow to five times what is live between collections, not twice,
// because a function's memory is billed whether it is used or not and the
// soft limit (MemoryLimit, or the deployer's GOMEMLIMIT) brings the
// collections back as the heap nears it. The figures behind the choice are
// in docs/PERFORMANCE.md ("The functions' runtime").
const FunctionGCPercent = 400

// GCPercent is the pace a function's collector should run at
// (runtime/debug.SetGCPercent): FunctionGCPercent inside Lambda, where
// the function's memory size is known and the process runs under a soft
// memory limit. It is 0, leave the runtime's pace alone, outside Lambda
// and when GOGC is set: the runtime applied that one itself at start.
func GCPercent(env Env) int {
	getenv := env.getenv()
	if getenv("GOGC") != "" {
		return 0
	}
	if mb, err := strconv.ParseInt(getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"), 10, 64); err != nil || mb <= 0 {
		return 0
	}
	return FunctionGCPercent
}
