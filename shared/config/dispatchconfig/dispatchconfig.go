// Package dispatchconfig reads the dispatch function's configuration from
// the environment: the engine's variables and the routes, on top of what
// package config reads for every function. It is the config package's
// part that builds a dispatch.Config and parses the routes, apart so that
// the reaper, replay and metrics functions, which import config, do not
// link the routes' JSON Schema library and pay for its initialisation at
// every cold start (as package dispatchfn is apart from package handler).
//
// The variables are registered in config.Variables with the others, and
// read here alone.
package dispatchconfig

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/dispatcher/shared/config"
	"github.com/outboxkit/dispatcher/shared/dbpool"
	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/fanout"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/route"
)

// Dispatch is the dispatch function's configuration.
type Dispatch struct {
	config.Function
	Engine dispatch.Config
	// Linger is what an invocation does once drained.
	Linger Linger
	// FanOut bounds the workers a backlog starts (Function is the
	// runtime's function name; empty outside Lambda).
	FanOut fanout.Config
	// AttemptCeiling bounds the attempts of every message: the store's,
	// and every route's max_attempts (Routes was checked against it).
	AttemptCeiling int
	Routes         *route.Table
	// SigningSecrets holds the value of each variable a route's
	// signing_secret_env names ("" when it is unset), for the webhook
	// targets to decode.
	SigningSecrets map[string]string
}

// Linger is how an invocation waits for new work after draining.
type Linger struct {
	// Enabled: wait until the deadline less the safety margin.
	Enabled bool
	// Listen: LISTEN on a connection of its own, claiming anyway every
	// ListenPollInterval; otherwise claim every PollInterval.
	Listen             bool
	PollInterval       time.Duration
	ListenPollInterval time.Duration
}

// Serve is outboxctl serve's configuration: the dispatch function's, and
// the reaper's when the server runs one.
type Serve struct {
	Dispatch Dispatch
	// Reaper is nil when the server runs no reaper.
	Reaper *config.Reaper
}

// ErrNoRoutes is wrapped by the error of a configuration without
// OUTBOX_ROUTES, OUTBOX_ROUTES_FILE or OUTBOX_ROUTES_SSM_PARAMETER.
var ErrNoRoutes = errors.New("route: no routes configured")

// engineNames names the engine's settings in its messages.
var engineNames = dispatch.Names{
	BatchSize:         "OUTBOX_BATCH_SIZE",
	MaxBatches:        "OUTBOX_MAX_BATCHES",
	Lease:             "OUTBOX_LEASE",
	SafetyMargin:      "OUTBOX_SAFETY_MARGIN",
	OrderedRun:        "OUTBOX_ORDERED_RUN",
	BatchBytes:        "OUTBOX_BATCH_MAX_BYTES",
	TargetConcurrency: "OUTBOX_TARGET_CONCURRENCY",
}

// Load reads the dispatch function's configuration: every problem
// (logging, database, engine limits, routes) is reported at once, one per
// line, each naming its variable.
func Load(env config.Env) (Dispatch, error) {
	fn, err := config.LoadFunction(env)
	d, dispatchErr := load(env, fn)
	if err := errors.Join(err, dispatchErr); err != nil {
		return Dispatch{}, err
	}
	return d, nil
}

// LoadServe reads outboxctl serve's configuration: the dispatch
// function's, and with reaper the reaper's, every problem at once.
func LoadServe(env config.Env, reaper bool) (Serve, error) {
	fn, err := config.LoadFunction(env)
	d, dispatchErr := load(env, fn)
	problems := []error{err, dispatchErr}
	var s Serve
	if reaper {
		r := config.NewReader(env)
		c := config.ReadReaper(r, fn)
		problems = append(problems, r.Err())
		s.Reaper = &c
	}
	if err := errors.Join(problems...); err != nil {
		return Serve{}, err
	}
	s.Dispatch = d
	return s, nil
}

// load reads the dispatch variables and the routes.
func load(env config.Env, fn config.Function) (Dispatch, error) {
	var problems []error
	r := config.NewReader(env)
	d := Dispatch{
		Function: fn,
		Engine: dispatch.Config{
			BatchSize:         r.Int("OUTBOX_BATCH_SIZE"),
			MaxBatches:        r.Int("OUTBOX_MAX_BATCHES"),
			Namespaces:        r.List("OUTBOX_NAMESPACES"),
			FunctionTimeout:   r.Duration("OUTBOX_FUNCTION_TIMEOUT"),
			SafetyMargin:      r.Duration("OUTBOX_SAFETY_MARGIN"),
			TargetConcurrency: r.Int("OUTBOX_TARGET_CONCURRENCY"),
			OrderedRun:        r.Int("OUTBOX_ORDERED_RUN"),
			BatchBytes:        int64(r.Int("OUTBOX_BATCH_MAX_BYTES")),
			Names:             engineNames,
		},
		AttemptCeiling: config.AttemptCeiling(r),
		Linger: Linger{
			Enabled: onOff(r, "OUTBOX_LINGER"), Listen: onOff(r, "OUTBOX_LISTEN"),
			PollInterval: r.Duration("OUTBOX_POLL_INTERVAL"), ListenPollInterval: config.ListeningPollInterval,
		},
	}
	d.FanOut = fanout.Config{
		Function: fn.Lambda.FunctionName, MaxWorkers: r.Int("OUTBOX_MAX_WORKERS"), Generations: r.Int("OUTBOX_FANOUT_GENERATIONS"),
		FunctionTimeout: d.Engine.FunctionTimeout, SafetyMargin: d.Engine.SafetyMargin,
		DrainWithin: r.Duration("OUTBOX_FANOUT_DRAIN_WITHIN"),
	}
	if d.FanOut.SafetyMargin == 0 {
		d.FanOut.SafetyMargin = config.DefaultSafetyMargin
	}
	if d.FanOut.MaxWorkers > 1 && fn.Lambda.FunctionName != "" && d.Engine.FunctionTimeout == 0 {
		r.Fail("OUTBOX_MAX_WORKERS", "is %d but OUTBOX_FUNCTION_TIMEOUT is unset: fan-out sizes its workers by the function timeout", d.FanOut.MaxWorkers)
	}
	for _, ns := range d.Engine.Namespaces {
		if !outbox.NamePattern.MatchString(ns) {
			r.Fail("OUTBOX_NAMESPACES", "contains %q, which is not a namespace", ns)
		}
	}
	if fn.Database.Pooler == dbpool.PoolerTransaction {
		// A transaction pooler hands each transaction to any server
		// connection: a LISTEN would be left on one nobody reads.
		if r.IsSet("OUTBOX_LISTEN") && d.Linger.Listen {
			r.Fail("OUTBOX_LISTEN", "is on, but a transaction pooler (OUTBOX_DB_POOLER=transaction) cannot keep a LISTEN: unset it, and a lingering invocation polls every OUTBOX_POLL_INTERVAL")
		}
		d.Linger.Listen = false
	}
	d.Engine.Lease = r.Duration("OUTBOX_LEASE")
	if err := r.Err(); err != nil {
		problems = append(problems, err)
	} else if err := d.Engine.Validate(); err != nil {
		// The engine's own checks, the lease against the safety margin.
		problems = append(problems, err)
	}
	// The routes are checked against the ceiling the store will apply.
	routes, err := loadRoutes(env, route.Options{AttemptCeiling: d.AttemptCeiling})
	if err != nil {
		problems = append(problems, err)
	} else {
		d.Routes = routes
		d.SigningSecrets = signingSecrets(env, routes)
	}
	return d, errors.Join(problems...)
}

// onOff reads an on/off switch: on, true, 1 or off, false, 0.
func onOff(r *config.Reader, name string) bool {
	switch v := strings.ToLower(r.String(name)); v {
	case "on", "true", "1":
		return true
	case "off", "false", "0":
		return false
	default:
		r.Fail(name, "must be on or off, got %q", v)
		return false
	}
}

// loadRoutes reads the routes named by OUTBOX_ROUTES (the configuration as
// text), OUTBOX_ROUTES_FILE (a path) or OUTBOX_ROUTES_SSM_PARAMETER (an SSM
// parameter): exactly one must be set. An invalid configuration is a
// *route.ConfigError whose Source names the variable (and the file or
// parameter).
func loadRoutes(env config.Env, opts route.Options) (*route.Table, error) {
	text, path, parameter := env.Get("OUTBOX_ROUTES"), env.Get("OUTBOX_ROUTES_FILE"), env.Get("OUTBOX_ROUTES_SSM_PARAMETER")
	var set []string
	for _, v := range []struct{ name, value string }{
		{"OUTBOX_ROUTES", text}, {"OUTBOX_ROUTES_FILE", path}, {"OUTBOX_ROUTES_SSM_PARAMETER", parameter},
	} {
		if v.value != "" {
			set = append(set, v.name)
		}
	}
	var (
		data   []byte
		source string
	)
	switch {
	case len(set) > 1:
		return nil, fmt.Errorf("route: %s are set; set exactly one", strings.Join(set, " and "))
	case len(set) == 0:
		return nil, fmt.Errorf("%w: set OUTBOX_ROUTES (the configuration as JSON), OUTBOX_ROUTES_FILE (the path of a JSON or YAML file) or OUTBOX_ROUTES_SSM_PARAMETER (an SSM parameter holding it)", ErrNoRoutes)
	case text != "":
		data, source = []byte(text), "OUTBOX_ROUTES"
	case path != "":
		var err error
		if data, err = env.Read(path); err != nil {
			return nil, fmt.Errorf("route: OUTBOX_ROUTES_FILE: reading %q: %w", path, err)
		}
		source = fmt.Sprintf("OUTBOX_ROUTES_FILE %q", path)
	default:
		value, err := env.Parameter(parameter)
		if err != nil {
			return nil, fmt.Errorf("route: OUTBOX_ROUTES_SSM_PARAMETER: reading %q: %w", parameter, err)
		}
		data, source = []byte(value), fmt.Sprintf("OUTBOX_ROUTES_SSM_PARAMETER %q", parameter)
	}
	t, err := route.Parse(data, opts)
	if err != nil {
		if ce, ok := errors.AsType[*route.ConfigError](err); ok {
			ce.Source = source
		}
		return nil, err
	}
	return t, nil
}

// signingSecrets reads the variables the routes' signing_secret_env name.
func signingSecrets(env config.Env, routes *route.Table) map[string]string {
	secrets := map[string]string{}
	for _, r := range routes.Routes {
		if name := r.Target.SigningSecretEnv; name != "" {
			secrets[name] = env.Get(name)
		}
	}
	return secrets
}
