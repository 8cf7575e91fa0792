// Package sns publishes outbox messages to an Amazon SNS topic with
// PublishBatch, and answers one publish.Result per message.
//
// # Building one
//
// Build the client once per cold start with [NewClient], and the publisher
// with [New]:
//
//	awsCfg, err := config.LoadDefaultConfig(ctx)
//	client := sns.NewClient(awsCfg, sns.DefaultConcurrency)
//	pub, err := sns.New(client, sns.Config{TopicARN: arn})
//
// NewClient does two things a default client gets wrong for this job. It
// keeps the SDK's retries short (two attempts, no retry quota): the outbox
// retries with its own backoff and attempt ceiling, and the invocation has a
// deadline that a long SDK backoff would eat. And it keeps at least as many
// idle HTTP connections per host as there can be calls in flight: with
// fewer, the calls beyond the pool open a new connection (and handshake)
// every time. A client built some other way must do the same; Publish is
// correct whatever the retryer, since each call's Timeout bounds the SDK's
// retries too.
//
// It also serializes PublishBatch requests itself: the same bytes as the
// SDK's query serializer, which spent more CPU on a call of 10 than the
// rest of the client's work on it (docs/PERFORMANCE.md has the figures). A
// hot ordering key's calls go one after another, so that time added to
// each of them; everywhere else it is Lambda CPU. TestSerializerWritesWhatTheSDKWrites holds the two equal, so
// an SDK upgrade that changes the wire format fails it.
//
// # What is sent
//
// Messages go out in PublishBatch calls of at most 10 entries whose total
// size is within Config.MaxMessageBytes, SNS counting the body plus every
// attribute's name, data type and value, packed by publish.Batcher: each
// ordering key's messages in sequence order, a key's next entries only once
// its call in flight is answered, different keys and unordered messages
// side by side in one call (see Order, below). Up to Config.Concurrency
// calls are in flight at once, each under its own Config.Timeout; the first
// goes out while the rest are still being encoded. A message over the cap
// by itself is a terminal PAYLOAD_TOO_LARGE, never sent.
//
// The body is the payload JSON (with Config.CloudEvents, route format
// cloudevents, the structured CloudEvent, its data the payload). The
// message attributes are outbox.id,
// outbox.namespace, outbox.topic, outbox.attempt (Number), and when set
// outbox.tenant_id, outbox.dedupe_key, outbox.sequence_id (Number) and
// outbox.trace_header — SNS has no per-message trace field, so the
// producer's X-Ray trace header travels as an attribute — then the
// message's headers, and for a payload offloaded to S3 (package offload,
// the body then its pointer) ExtendedPayloadSize (Number). SNS allows 10
// attributes per message, names of at most 256 characters of A-Z a-z 0-9
// _ - . (not starting with AWS. or Amazon., no leading, trailing or doubled
// period) and non-empty values;
// headers may not start with outbox., the publisher's own prefix. A
// message that breaks a rule is a terminal INVALID_PAYLOAD whose
// *InvalidMessageError names the rule and the attribute; no header is ever
// dropped to make it fit.
//
// # FIFO topics
//
// A topic whose name ends in ".fifo" gets, on every message, a
// MessageGroupId — the ordering key, else Config.DefaultGroupID — and a
// MessageDeduplicationId — "namespace|topic|dedupe_key", else the message
// id. The dedupe key is scoped because the outbox makes it unique per
// namespace and topic only, while one FIFO topic often serves several
// topics; unscoped, SNS would silently drop the second of two messages that
// share a key. Either id must be at most 128 letters, digits and ASCII
// punctuation; one that is not is replaced by the hex SHA-256 of it, which
// is deterministic, so retries and replays of a message still carry the
// same ids and SNS still deduplicates them.
//
// # Order
//
// A claim may hand one Publish several consecutive messages of an ordering
// key. Their entries go out in sequence order: consecutive within one call,
// which a FIFO topic publishes in order within the message group, and a
// key's later entries only in a call made after its earlier call was
// answered. At the first entry of a key that is not delivered, the rest of
// the key is not sent and comes back publish.Released, for the engine to
// give back untouched; other keys and unordered messages are not held up.
//
// One case is SNS's doing, not ours: a call that answers an entry of a key
// as failed and a later entry of the same key, in the same call, as
// published. The later one was published — sending it again would deliver
// it twice — so it stays delivered, and the key stops there (what follows
// it is Released). Its subscribers then see it before the failed one's
// retry: out of order, once. The publisher has no logger to report it
// with; the results (a failure followed by a delivery of one key) are the
// record.
//
// # Results
//
// Each entry of a successful call is answered from the call's answer:
// Successful → delivered, the SNS MessageId as target ref; Failed → by
// SenderFault and code; in neither list → retryable TARGET_5XX. A failed
// call answers all its entries alike, unless SNS blames one of them (see
// the decisions below). Every result carries the duration of the call that
// carried it (publish.Result.Latency). The mapping lives in one function,
// classify (classify.go):
//
//	Throttling, ThrottlingException, Throttled(Exception),
//	  RequestLimitExceeded, TooManyRequestsException, KMSThrottling, HTTP 429
//	                                              → retryable THROTTLED
//	InternalError, InternalFailure, ServiceUnavailable, HTTP 5xx,
//	  an entry with SenderFault false             → retryable TARGET_5XX
//	no credentials to sign with (awserr.
//	  CredentialsUnavailable: none configured, or
//	  instance metadata/STS/SSO failed)           → retryable ACCESS_DENIED
//	ExpiredToken, RequestExpired                  → retryable ACCESS_DENIED
//	AuthorizationError, AccessDenied(Exception), InvalidClientTokenId,
//	  SignatureDoesNotMatch, InvalidSignature,
//	  MissingAuthenticationToken, AuthFailure,
//	  NotAuthorized, OptInRequired, KMSAccessDenied,
//	  KMSDisabled, KMSInvalidState, KMSNotFound,
//	  KMSOptInRequired, …                         → terminal ACCESS_DENIED
//	NotFound (no such topic)                      → terminal TARGET_NOT_FOUND
//	BatchRequestTooLong, or InvalidParameter
//	  saying "Message too long"                   → terminal PAYLOAD_TOO_LARGE
//	InvalidParameter, InvalidParameterValue       → terminal INVALID_PAYLOAD
//	another code on an entry, SenderFault true    → terminal TARGET_REJECTED
//	the call's Timeout                            → retryable TIMEOUT
//	the invocation's context                      → retryable CANCELED
//	refused, reset, EOF, DNS                      → retryable NETWORK
//	no known code on a call, HTTP 401 or 403      → retryable ACCESS_DENIED
//	no known code on a call, HTTP 404             → retryable TARGET_NOT_FOUND
//	another code on a call (4xx)                  → retryable TARGET_REJECTED
//	anything else                                 → retryable TARGET_5XX
//
// Three of these are decisions:
//
//   - ExpiredToken and RequestExpired are retryable: the SDK fetches fresh
//     credentials and corrects clock skew on the next call, and in Lambda a
//     new sandbox brings new credentials. Terminal, a credential hiccup
//     would dead-letter every batch of the minute.
//   - A whole-call InvalidParameter (or BatchRequestTooLong) blames the
//     request, but the request is up to ten messages and SNS does not say
//     which. The publisher splits the call in halves and sends each, in
//     order, recursively, so only the message SNS refuses on its own ends
//     terminal (INVALID_PAYLOAD, or PAYLOAD_TOO_LARGE when the topic's cap
//     is lower than Config.MaxMessageBytes) and its neighbours are
//     delivered — except the later messages of its own ordering key, which
//     are Released rather than sent in a later half. A call of ten costs
//     at most 19 calls, and only when every message is bad.
//   - An unknown error is retryable: retrying costs an attempt, while
//     dead-lettering something SNS would have taken a minute later costs an
//     operator's replay, and the attempt ceiling ends a persistent failure
//     anyway.
//
// An error code from SNS decides even when the context ended meanwhile: SNS
// did answer.
package sns
