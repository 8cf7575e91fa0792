// The producer API, a module of its own so that a producer service builds
// pgx and none of the dispatcher. Its go directive is the one pgx requires:
// the code needs no newer Go. Its tests against a database are in the root
// module, next to the migrations: shared/outboxdb.
module github.com/outboxkit/dispatcher/shared/outbox

go 1.25.0

require (
	github.com/google/uuid v1.6.0
	github.com/jackc/pgx/v5 v5.12.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	golang.org/x/text v0.41.0 // indirect
)
