package outboxtype

// GateOptions are a route's "circuit_breaker" and "rate_limit" as written
// (zero: none), embedded in route.Route: the routes schema checks them and
// package dispatch applies them through package gate.
type GateOptions struct {
	CircuitBreaker struct {
		Failures float64 `json:"failures"`
		CoolDown string  `json:"cool_down"`
	} `json:"circuit_breaker"`
	RateLimit struct {
		PerSecond float64 `json:"per_second"`
	} `json:"rate_limit"`
}
