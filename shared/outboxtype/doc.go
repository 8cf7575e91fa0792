// Package outboxtype holds the types that cross the dispatcher's layers, so
// that each layer can speak of a message without importing another:
//
//   - [Message]: a claimed message, as the store (shared/lease) hands it to
//     the engine (shared/dispatch) and the engine to every publisher
//     (shared/publish/...). [Keys] are the fields every view of a stored
//     message shares: the claimed message, a dead letter, a message looked
//     up by an operator.
//   - [Code]: why a message was not delivered, as publishers answer it, the
//     engine applies its policies to it and the database records it.
//   - [Outcome] and [OnDead]: what the engine records for a message, and
//     what the death of an ordered message does to its key.
//   - [Status]: what the database did with an outcome.
//   - [DefaultAttemptCeiling]: the database's default ceiling on attempts,
//     which the store applies and the route table checks retry policies
//     against.
//
// It is a leaf, as River's rivertype is: it imports the standard library
// and uuid, nothing of the module, so a publisher links no database driver
// and the store links no publisher (a test holds both to it). Behaviour
// stays with its owner: the Publisher contract and the scheduler in
// shared/publish, the SQL in shared/lease, the policies in shared/dispatch.
package outboxtype
