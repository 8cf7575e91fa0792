// Package lambdainvoke is the Lambda plugin publisher: it invokes one
// function synchronously (Invoke, InvocationType RequestResponse) per
// message with the message's [publish.Envelope] as the event, a bounded
// number at once ([Config.Concurrency]), and maps the outcome to a
// [publish.Result]. The messages of one ordering key are invoked one after
// another, each only once the function accepted the one before; at the
// first it does not accept, the rest of the key is not sent
// (publish.Released). Different keys go side by side.
//
// # The plugin contract
//
// This is what a plugin function's author codes against.
//
// The event is the envelope, the same JSON an HTTP plugin receives (with
// Config.CloudEvents, route format cloudevents, the structured CloudEvent of
// package cloudevent instead):
//
//	{"id":"0190…","key":"order-42-paid","namespace":"billing","topic":"invoice_paid",
//	 "tenant_id":"t-1","ordering_key":"order-42","sequence_id":7,"attempt":1,
//	 "created_at":"2025-01-02T03:04:05.123456Z","headers":{…},"payload":{…}}
//
// Delivery is at least once: the same message can arrive again (a lost
// answer, a timeout, a replay), with the same "key". Deduplicate on it.
//
// The answer. Return normally and the message is delivered: any response,
// or none, means delivered, unless it is a JSON object whose "status" says
// otherwise ([Response] is that object in Go):
//
//	{"status":"ok"}, {"status":"delivered"}, no "status"    delivered
//	{"status":"rejected","error":"unknown customer"}         terminal  TARGET_REJECTED,
//	                                                         dead-lettered with the error
//	{"status":"retry","error":"ledger locked",               retryable TARGET_5XX, not
//	 "retry_after_seconds":30}                               before the seconds (optional)
//	any other "status", or one that is not a string          retryable TARGET_5XX, the error
//	                                                         naming it: a plugin bug should
//	                                                         not dead-letter messages while
//	                                                         it is being fixed
//
// Fail (throw, return an error, crash, time out) and the message is
// retryable FUNCTION_ERROR: Lambda answers with X-Amz-Function-Error and
// {"errorType":…,"errorMessage":…}. Unless the errorType is "TerminalError"
// (or ends in ".TerminalError" or "$TerminalError", as Java and others
// qualify class names): then it is terminal FUNCTION_ERROR, dead-lettered
// with the errorMessage. In Go (aws-lambda-go), return a *[TerminalError]
// unwrapped, since aws-lambda-go reports the returned error's type name;
// elsewhere, throw an error whose type or name is TerminalError.
//
// The message's target_ref, on delivery, is the invocation's request id,
// which is how the plugin's own logs name it.
//
// # Invoke API errors
//
// Classified in one place (classify), by the error code the API returns
// (never its message), then by HTTP status:
//
//	TooManyRequestsException, EC2ThrottledException, 429    retryable THROTTLED (Retry-After honoured)
//	ServiceException, 5xx, ResourceNotReadyException,
//	ResourceConflictException, SnapStart*, EFS*, ENI/subnet
//	limits, and other errors of the function's environment  retryable TARGET_5XX
//	ResourceNotFoundException, 404                          terminal  TARGET_NOT_FOUND
//	no credentials to sign with (awserr.CredentialsUnavailable:
//	none configured, or instance metadata/STS/SSO failed),
//	ExpiredTokenException, ExpiredToken, RequestExpired     retryable ACCESS_DENIED
//	AccessDeniedException, KMS*Exception, EC2AccessDenied-
//	Exception, UnrecognizedClientException, InvalidSignature-
//	Exception, MissingAuthenticationTokenException, 401, 403 terminal  ACCESS_DENIED
//	RequestTooLargeException, 413                           terminal  PAYLOAD_TOO_LARGE
//	InvalidRequestContentException, UnsupportedMediaType    terminal  INVALID_PAYLOAD
//	other 4xx                                               terminal  TARGET_REJECTED
//	Config.Timeout expired                                  retryable TIMEOUT
//	the caller's context ended                              retryable CANCELED
//	no answer (refused, reset, DNS, …)                      retryable NETWORK
//
// A message whose envelope is over Config.MaxPayloadBytes (at most Lambda's
// 6 MB synchronous request cap) is terminal PAYLOAD_TOO_LARGE without a call.
//
// # Retries and connections
//
// The outbox owns retries: each is recorded in outbox.attempts and backed
// off with jitter under the route's policy. The client's own retryer (the
// SDK's) still applies to each Invoke: keep it short, since a retried
// Invoke runs the function again within one outbox attempt. The client is
// built once per cold start; give it a transport with at least Concurrency
// idle connections per host ([NewHTTPClient]; the SDK's default keeps 10)
// so that bursts reuse connections.
package lambdainvoke
