package eventbridge

// Exported for the external tests' benchmarks.
var AppendPutEventsRequest = appendPutEventsRequest

const (
	PutEventsTarget = putEventsTarget
	JSONContentType = jsonContentType
)
