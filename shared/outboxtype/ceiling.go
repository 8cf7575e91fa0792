package outboxtype

// DefaultAttemptCeiling is the hard ceiling on attempts the database applies
// whatever a route's retry policy says: a RETRYABLE outcome at or past it
// dead-letters the message ([StatusDead]), and so does an expired lease (a
// message that crashes every dispatcher that takes it). It is the one
// declaration of the default: the store's (shared/lease) when it is not
// configured, OUTBOX_ATTEMPT_CEILING's, and the route table's largest
// retry.max_attempts (shared/route) refer to it, and a test holds the SQL
// functions' DEFAULT to it. It lives in the leaf so that the route table
// knows it without linking the store.
const DefaultAttemptCeiling = 100
