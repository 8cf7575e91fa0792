package proposal

import (
	"fmt"
	"io/fs"
	"strings"

	"github.com/outboxkit/dispatcher/migrations"
)

// LeanCompleteFunction is the name LeanCompleteSQL gives its function, so
// that it sits next to the product's in a scratch database and the two can
// be called turn about.
const LeanCompleteFunction = "outbox.complete_batch_lean"

// LeanCompleteSQL returns a CREATE OR REPLACE of LeanCompleteFunction: the
// migration's own outbox.complete_batch with one change: the rows a
// completion deletes carry their payload and headers through the
// statement's CTEs only when they are going to the dead letters. A
// DISPATCHED row (nearly all of them) no longer has its payload copied
// into the CTE's tuple store just to be thrown away. The text is taken from
// the embedded migrations, so the proposal tracks the product; an error
// means the migration no longer has the shape this change applies to.
func LeanCompleteSQL() (string, error) {
	def, err := functionDefinition("outbox.complete_batch(")
	if err != nil {
		return "", err
	}
	const from = "p.payload, p.headers, p.trace_header, p.attempt_count, p.available_at, p.created_at,"
	const to = "CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.payload END AS payload,\n" +
		"                  CASE WHEN r.outcome = 'DISPATCHED' THEN NULL ELSE p.headers END AS headers,\n" +
		"                  p.trace_header, p.attempt_count, p.available_at, p.created_at,"
	if strings.Count(def, from) != 1 {
		return "", fmt.Errorf("proposal: outbox.complete_batch no longer returns %q once", from)
	}
	def = strings.Replace(def, from, to, 1)
	return strings.Replace(def, "outbox.complete_batch(", LeanCompleteFunction+"(", 1), nil
}

// functionDefinition is the CREATE FUNCTION statement of the named function
// in the embedded migrations, turned into a CREATE OR REPLACE.
func functionDefinition(nameParen string) (string, error) {
	b, err := fs.ReadFile(migrations.FS(), "00002_outbox_functions.sql")
	if err != nil {
		return "", err
	}
	text := string(b)
	start := strings.Index(text, "CREATE FUNCTION "+nameParen)
	if start < 0 {
		return "", fmt.Errorf("proposal: no CREATE FUNCTION %s in the migrations", nameParen)
	}
	end := strings.Index(text[start:], "-- +goose StatementEnd")
	if end < 0 {
		return "", fmt.Errorf("proposal: %s has no StatementEnd", nameParen)
	}
	return "CREATE OR REPLACE FUNCTION " + strings.TrimPrefix(text[start:start+end], "CREATE FUNCTION "), nil
}
