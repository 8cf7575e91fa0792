package outboxdb_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// The Go producer and the database measure and refuse payloads alike: for
// thousands of generated documents (escapes, repeated keys, numbers in
// every notation near every bound, deep nesting), outbox.StoredSize is the
// length of the jsonb text PostgreSQL returns, and it refuses exactly what
// the database's outbox.payload_problem or jsonb itself refuses.
func TestGoAndDatabaseMeasurePayloadsAlike(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rng := rand.New(rand.NewPCG(7, 26))
	docs := []string{
		`{"a":1e3,"b":[2.50,1E-2]}`, `{ "k" :  "\u00e9" ,   "k" : "last" }`, `[-0, -0.0, 0e5, 0.0e-3, -0e-5, 1.50e1, 100e-2]`,
		`[9.99e999]`, `[1e1000]`, `[-1e-1000]`, `[1e-1001]`, `[0.0001e-997]`, `[123.456e-10, -1.0E+2, 12.3400e1]`,
		`{"s":"\"\\\/\b\f\n\r\t\u0001\u001f\u007f\ud83d\ude00é"}`, `{"":{"":[]}}`, `{"a":{},"b":[],"c":[{}]}`,
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		`[1e131071]`, `[1e131072]`, `{"a":"\u0000"}`, `[` + strings.Repeat("9", 1500) + `]`,
	}
	for range 3000 {
		docs = append(docs, generateDocument(rng, 0))
	}
	for i, doc := range docs {
		goSize, goErr := outbox.StoredSize([]byte(doc))
		var sqlSize *int
		var sqlProblem *string
		// A document jsonb cannot parse fails with a data exception (22...)
		// or, nested beyond the server's stack, 54001.
		sqlErr := db.Pool.QueryRow(ctx, `SELECT octet_length(($1::text::jsonb)::text), outbox.payload_problem($1::text::jsonb)`,
			doc).Scan(&sqlSize, &sqlProblem)
		var pgErr *pgconn.PgError
		if sqlErr != nil && (!errors.As(sqlErr, &pgErr) || !(strings.HasPrefix(pgErr.Code, "22") || pgErr.Code == "54001")) {
			t.Fatalf("document %d: %v", i, sqlErr)
		}
		sqlRefuses := sqlErr != nil || sqlProblem != nil
		switch {
		case (goErr != nil) != sqlRefuses:
			t.Fatalf("document %d %s: Go says %v, the database %v %v", i, abbreviated(doc), goErr, deref(sqlProblem), sqlErr)
		case goErr == nil && goSize != *sqlSize:
			t.Fatalf("document %d %s: Go measures %d bytes, the database stores %d", i, abbreviated(doc), goSize, *sqlSize)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func abbreviated(s string) string {
	if len(s) > 120 {
		return s[:80] + "…" + s[len(s)-30:]
	}
	return s
}

// generateDocument writes a random JSON value: objects (with repeated
// keys) and arrays at the top, every kind of scalar below.
func generateDocument(rng *rand.Rand, depth int) string {
	kind := rng.IntN(9)
	if depth == 0 {
		kind = rng.IntN(2)
	} else if depth > 4 {
		kind = 2 + rng.IntN(7)
	}
	space := func() string { return []string{"", " ", "\n\t", "  "}[rng.IntN(4)] }
	switch kind {
	case 0:
		n := rng.IntN(5)
		parts := make([]string, n)
		for i := range parts {
			key := []string{`"a"`, `"b"`, `"\u0061"`, `"é"`, `"\u00e9"`, `""`, `"k\n"`}[rng.IntN(7)]
			parts[i] = space() + key + space() + ":" + space() + generateDocument(rng, depth+1) + space()
		}
		return "{" + strings.Join(parts, ",") + "}"
	case 1:
		n := rng.IntN(5)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = space() + generateDocument(rng, depth+1) + space()
		}
		return "[" + strings.Join(parts, ",") + "]"
	case 2, 3, 4:
		return generateNumber(rng)
	case 5, 6:
		pieces := []string{"x", "é", "😀", `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0001`, `\u001F`, `\u007f`, `\u00E9`, `\ud83d\ude00`, " ", "\u007f"}
		var b strings.Builder
		for range rng.IntN(6) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		return `"` + b.String() + `"`
	case 7:
		return []string{"true", "false"}[rng.IntN(2)]
	default:
		return "null"
	}
}

func generateNumber(rng *rand.Rand) string {
	digits := func(n int, leadingZero bool) string {
		var b strings.Builder
		for i := range n {
			d := rng.IntN(10)
			if i == 0 && !leadingZero && d == 0 {
				d = 1 + rng.IntN(9)
			}
			b.WriteByte(byte('0' + d))
		}
		return b.String()
	}
	var s string
	if rng.IntN(4) == 0 {
		s = "-"
	}
	if rng.IntN(3) == 0 {
		s += "0"
	} else {
		s += digits(1+rng.IntN(4), false)
	}
	if rng.IntN(2) == 0 {
		s += "." + digits(1+rng.IntN(5), true)
	}
	if rng.IntN(2) == 0 {
		s += []string{"e", "E"}[rng.IntN(2)] + []string{"", "+", "-"}[rng.IntN(3)]
		exps := []int{0, 1, 3, 9, 99, 100, 995, 996, 997, 998, 999, 1000, 1001, 1002, 1004}
		s += fmt.Sprint(exps[rng.IntN(len(exps))])
	}
	return s
}
