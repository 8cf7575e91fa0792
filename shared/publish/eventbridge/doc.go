// Package eventbridge publishes claimed outbox messages to an Amazon
// EventBridge event bus with PutEvents, and reports one [publish.Result] per
// message: delivered with the EventId, retryable, or terminal.
//
// # What goes on the bus
//
// Each message becomes one PutEvents entry:
//
//	EventBusName  the route's bus (name or ARN)
//	Source        the Source template, default "outbox.{namespace}"
//	DetailType    the DetailType template, default "{topic}"
//	Detail        the payload, byte for byte; it must be a JSON object
//	              (with Config.CloudEvents, the structured CloudEvent, the
//	              payload its data, whatever its JSON type)
//	Time          the message's CreatedAt: the same on every attempt
//	TraceHeader   the producer's X-Ray trace header, when it stored one,
//	              else X-Ray's form of its traceparent header
//	Resources     none
//
// The templates are compiled once by [New]; {namespace} and {topic} are the
// only placeholders, and any other brace is a configuration error. A message
// whose substituted Source or DetailType breaks EventBridge's rules (empty,
// Source over 256 characters or starting with the AWS-reserved "aws.",
// DetailType over 128 characters), or whose payload is not a JSON object, is
// a terminal INVALID_PAYLOAD without a call, with an error naming the field.
//
// # Stable keys and deduplication
//
// Detail carries the payload and nothing else, because rules and targets
// match on it as the producer wrote it. EventBridge has no other per-entry
// field for the outbox's keys: Resources are ARNs that rules match on,
// TraceHeader belongs to X-Ray, and Source and DetailType are what rules
// route by. So the message id, dedupe key, sequence id and headers are not
// carried. The EventId a receiver sees as the event's "id" is new on every
// attempt, so it is not a deduplication key either: a call that timed out
// after EventBridge accepted it is delivered again, under another id.
// Receivers behind EventBridge must deduplicate on a business key inside the
// payload — producers of topics routed here put one there (typically the
// value they also pass as dedupe_key). A receiver that needs the outbox's own
// keys is routed to SNS (message attributes) or a plugin target (the
// envelope) instead.
//
// # Batching and size
//
// Messages go out in calls of at most 10 entries whose total size, by AWS's
// entry-size formula ([EntrySize]: the UTF-8 bytes of Source, DetailType,
// Detail and each Resources string, plus 14 when Time is set), stays within
// Config.MaxEntryBytes. One entry over the cap is a terminal
// PAYLOAD_TOO_LARGE without a call. The cap is a route setting because AWS
// raised it from 256 KiB to 1 MiB but accounts keep the old cap until
// raised. Calls go out concurrently, at most Config.Concurrency at a time,
// each under its own Config.Timeout.
//
// # Order
//
// The calls are packed by publish.Batcher: one call may carry several
// ordering keys and unordered messages, a key's entries consecutive and in
// sequence order, and a key's later entries go only in a call made after
// its earlier call was answered. At a key's first entry not delivered, the
// rest of the key is not sent and comes back publish.Released. EventBridge
// itself promises no order to its targets; what the outbox keeps is the
// order in which a key's events are put on the bus.
//
// # Results
//
// EventBridge answers each entry in request order: an EventId is a delivery;
// InternalFailure and ThrottlingException are retryable; every other entry
// error code is terminal. An answer with fewer entries than were sent leaves
// the missing ones retryable (TARGET_5XX): never dropped, never presumed
// delivered. A call that fails as a whole gives every entry the same result,
// classified from the AWS error code, then the context, then the HTTP
// status; that table (classify.go) is the only place codes are mapped.
//
// A whole-call ValidationException (or SerializationException, or HTTP 413)
// means something in the request is invalid, which is deterministic: the
// same request fails the same way every time. It is terminal, but when such
// a call carried more than one entry, each entry is first sent again on its
// own, in order, so that one bad entry is dead-lettered and the others are
// delivered, rather than all ten going to the dead letters together; the
// later entries of the bad entry's ordering key are Released, not sent. (One way to get
// there: a route whose MaxEntryBytes says 1 MiB on an account still capped
// at 256 KiB.) ExpiredTokenException is retryable ACCESS_DENIED — stale
// credentials are about the moment, not the message; every other denial is
// terminal ACCESS_DENIED.
//
// # Configuring the client
//
// Publish is correct whatever the client's retryer does, but the SDK's
// retries and this package's Timeout interact: the SDK retries throttling
// and 5xx answers inside one call, and all its attempts share the call's
// Timeout. The outbox already retries with backoff and jitter, durably, so
// keep the client's attempts small (2 or 3) and let a throttled message come
// back RETRYABLE rather than spend the invocation's time in SDK back-off.
// Give the client an HTTP transport that keeps at least Concurrency idle
// connections to the endpoint — the SDK's default transport keeps 10;
// net/http's default keeps 2, which turns most calls into new TLS
// connections and caps throughput well under Little's law. ExampleNew shows
// both settings.
//
// Throughput is Little's law: at most 10 × Concurrency messages per call
// latency. At 8 calls in flight and 20 ms per call that is 4,000 messages a
// second per Publish; BenchmarkPublishLittlesLaw measures how close the
// package comes.
package eventbridge
