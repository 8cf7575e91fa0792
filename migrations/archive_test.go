package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// The archive's partitioning (00014): days of message ids, a DEFAULT, days
// made ahead, days dropped whole by retention.

// v7At is SQL for a UUIDv7 made at the time the expression ts gives:
// its 48 time bits, version 7, random bits.
func v7At(ts string) string {
	return fmt.Sprintf(`(lpad(to_hex((extract(epoch FROM %s) * 1000)::bigint), 12, '0') || '7'
		|| substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid`, ts)
}

// dayBoundSQL is SQL for the UUIDv7 of 00:00 UTC of the day the expression
// d (a date) gives: a partition's bound.
func dayBoundSQL(d string) string {
	return fmt.Sprintf(`(lpad(to_hex((extract(epoch FROM (%s)::timestamp AT TIME ZONE 'UTC') * 1000)::bigint), 12, '0') || repeat('0', 20))::uuid`, d)
}

// makeDay makes the archive's partition of the day daysAgo days before
// today (UTC), as ensure_archive_partitions makes the days ahead.
func makeDay(t *testing.T, conn *pgx.Conn, daysAgo int) string {
	t.Helper()
	ctx := context.Background()
	day := fmt.Sprintf(`((now() AT TIME ZONE 'UTC')::date - %d)`, daysAgo)
	var name string
	if err := conn.QueryRow(ctx, `SELECT 'attempts_p' || to_char(`+day+`, 'YYYYMMDD')`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE TABLE outbox.%s PARTITION OF outbox.attempts FOR VALUES FROM (%s) TO (%s)`,
			name, dayBoundSQL(day), dayBoundSQL(day+" + 1")),
		`ALTER TABLE outbox.` + name + ` OWNER TO outbox_owner`,
		`CREATE TRIGGER attempts_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON outbox.` + name +
			` FOR EACH STATEMENT EXECUTE FUNCTION outbox.attempts_append_only()`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	var index string
	if err := conn.QueryRow(ctx, `SELECT x.indexrelid::regclass::text FROM pg_index x JOIN pg_inherits i ON i.inhrelid = x.indexrelid
		WHERE x.indrelid = $1::regclass AND i.inhparent = 'outbox.attempts_one_dispatched_per_message'::regclass`, "outbox."+name).Scan(&index); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER INDEX `+index+` RENAME TO `+name+`_one_dispatched_per_message`); err != nil {
		t.Fatal(err)
	}
	return name
}

// archiveRow inserts one archived attempt, as the owner may, and returns
// its id.
func archiveRow(t *testing.T, conn *pgx.Conn, messageID, state, createdAt string, dedupeKey any) int64 {
	t.Helper()
	var id int64
	err := conn.QueryRow(context.Background(), `
		INSERT INTO outbox.attempts (message_id, attempt_no, state, worker_id, namespace, topic, dedupe_key, target, created_at)
		VALUES ($1, 1, $2, 'w', 'billing', 'usage', $3, 'test', `+createdAt+`) RETURNING id`,
		messageID, state, dedupeKey).Scan(&id)
	if err != nil {
		t.Fatalf("archive %s %s: %v", messageID, state, err)
	}
	return id
}

func newID(t *testing.T, conn *pgx.Conn, at string) string {
	t.Helper()
	var id string
	if err := conn.QueryRow(context.Background(), `SELECT `+v7At(at)+`::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// archiveRows is every archived row as text, by id: what a migration must
// keep byte for byte.
func archiveRows(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT a::text FROM outbox.attempts a ORDER BY a.id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestArchiveMigrationDownAndUpKeepsEveryRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, conn := migratedEmpty(t)
	// Messages of today, of three days ago (no partition yet: DEFAULT),
	// of 100 days ago and one whose id is no v7.
	for _, r := range []struct{ id, state, at string }{
		{newID(t, conn, "now()"), "DISPATCHED", "now()"},
		{newID(t, conn, "now()"), "RETRYABLE", "now()"},
		{newID(t, conn, "now() - interval '3 days'"), "FAILED", "now() - interval '2 days'"},
		{newID(t, conn, "now() - interval '100 days'"), "REPLAYED", "now() - interval '99 days'"},
		{"6a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3", "DISPATCHED", "now()"},
	} {
		archiveRow(t, conn, r.id, r.state, r.at, "k-"+r.state)
	}
	before := archiveRows(t, conn)

	kind := func() string {
		var k string
		if err := conn.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'outbox.attempts'::regclass`).Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	// Down to before the partitioning (00014), through the key's change
	// (00015).
	if _, err := m.DownTo(ctx, 13); err != nil {
		t.Fatalf("down: %v", err)
	}
	if k := kind(); k != "r" {
		t.Fatalf("after down, outbox.attempts is of kind %q, want a plain table", k)
	}
	if after := archiveRows(t, conn); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("down changed the archive:\n%s\nwant\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	// The rollback keeps the archive append-only.
	if _, err := conn.Exec(ctx, `DELETE FROM outbox.attempts`); sqlstate(err) != "P0001" {
		t.Fatalf("delete after down: %v, want the append-only refusal", err)
	}

	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if k := kind(); k != "p" {
		t.Fatalf("after up, outbox.attempts is of kind %q, want a partitioned table", k)
	}
	if after := archiveRows(t, conn); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("up changed the archive:\n%s\nwant\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	// Where each went: the day three days ago got its partition; the day
	// 100 days ago and the non-v7 id are in DEFAULT.
	var inDefault, days int
	conn.QueryRow(ctx, `SELECT count(*) FROM outbox.attempts_default`).Scan(&inDefault)
	conn.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox.attempts'::regclass`).Scan(&days)
	if inDefault != 2 || days != 1+1+4 {
		t.Fatalf("after up: %d rows in DEFAULT, %d partitions; want 2 and 6 (DEFAULT, 3 days ago, today and 3 ahead)", inDefault, days)
	}
	// Ids go on after the last one.
	var maxBefore, next int64
	conn.QueryRow(ctx, `SELECT max(id) FROM outbox.attempts`).Scan(&maxBefore)
	next = archiveRow(t, conn, newID(t, conn, "now()"), "RETRYABLE", "now()", nil)
	if next <= maxBefore {
		t.Fatalf("a new attempt got id %d, not above %d", next, maxBefore)
	}
}

func TestPurgeDropsAnExpiredDayAndKeepsWhatRetentionKeeps(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	owner := pgtest.Connect(t, db.URL)
	if _, err := owner.Exec(ctx, `SELECT outbox.ensure_archive_partitions(3)`); err != nil {
		t.Fatal(err)
	}
	expired := makeDay(t, owner, 10)
	young := makeDay(t, owner, 1)
	at := "now() - interval '10 days'"

	delivered := newID(t, owner, at) // forgotten; its key keeps the time
	deliveredAt := archiveRow(t, owner, delivered, "DISPATCHED", at, "k-delivered")
	if _, err := owner.Exec(ctx, `INSERT INTO outbox.dedupe (namespace, topic, dedupe_key, message_id, created_at)
		VALUES ('billing', 'usage', 'k-delivered', $1, now() - interval '10 days')`, delivered); err != nil {
		t.Fatal(err)
	}
	late := newID(t, owner, at) // retried then, delivered an hour ago
	archiveRow(t, owner, late, "RETRYABLE", at, nil)
	archiveRow(t, owner, late, "DISPATCHED", "now() - interval '1 hour'", nil)
	pending := newID(t, owner, at)
	archiveRow(t, owner, pending, "RETRYABLE", at, nil)
	dead := newID(t, owner, at)
	archiveRow(t, owner, dead, "FAILED", at, nil)
	replayed := newID(t, owner, at)
	archiveRow(t, owner, replayed, "REPLAYED", at, nil)
	for _, stmt := range []string{
		`INSERT INTO outbox.pending (id, namespace, topic, payload, payload_bytes, created_at) VALUES ('` + pending + `', 'billing', 'usage', '{}', 2, now() - interval '10 days')`,
		`INSERT INTO outbox.dead (id, namespace, topic, payload, payload_bytes, attempt_count, available_at, created_at)
		 VALUES ('` + dead + `', 'billing', 'usage', '{}', 2, 1, now() - interval '10 days', now() - interval '10 days')`,
	} {
		if _, err := owner.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	// A day never made (100 days ago): its row is in DEFAULT, purged row
	// by row.
	ancient := newID(t, owner, "now() - interval '100 days'")
	archiveRow(t, owner, ancient, "DISPATCHED", "now() - interval '100 days'", nil)
	yesterday := newID(t, owner, "now() - interval '1 day'")
	archiveRow(t, owner, yesterday, "DISPATCHED", "now() - interval '1 day'", nil)

	survivors := func() string {
		var s string
		if err := owner.QueryRow(ctx, `SELECT string_agg(a::text, E'\n' ORDER BY a.id) FROM outbox.attempts a
			WHERE a.message_id = ANY ($1::uuid[]) AND (a.state <> 'RETRYABLE' OR a.message_id = $2::uuid)`,
			[]string{late, pending, dead, replayed}, pending).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	want := survivors()
	var deliveredTime time.Time
	owner.QueryRow(ctx, `SELECT created_at FROM outbox.attempts WHERE id = $1`, deliveredAt).Scan(&deliveredTime)

	dispatcher := pgtest.Connect(t, db.LoginAs(t, "outbox_dispatcher"))
	var purged, dedupe, keys int64
	if err := dispatcher.QueryRow(ctx, `SELECT * FROM outbox.purge('2 days', NULL, 1000)`).Scan(&purged, &dedupe, &keys); err != nil {
		t.Fatal(err)
	}
	// Gone: the delivered message's row and the late one's old retry
	// (dropped with their day), and the row in DEFAULT.
	if purged != 3 {
		t.Errorf("purge reported %d archived rows, want 3", purged)
	}
	exists := func(table string) bool {
		var ok bool
		owner.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, "outbox."+table).Scan(&ok)
		return ok
	}
	if exists(expired) {
		t.Errorf("the expired day %s was not dropped", expired)
	}
	if !exists(young) {
		t.Errorf("the young day %s was dropped", young)
	}
	if got := survivors(); got != want {
		t.Errorf("survivors after the drop:\n%s\nwant\n%s", got, want)
	}
	var inDefault, inYoung, gone int
	owner.QueryRow(ctx, `SELECT count(*) FROM outbox.attempts_default`).Scan(&inDefault)
	owner.QueryRow(ctx, `SELECT count(*) FROM outbox.`+young).Scan(&inYoung)
	owner.QueryRow(ctx, `SELECT count(*) FROM outbox.attempts WHERE message_id IN ($1, $3) OR (message_id = $2 AND state = 'RETRYABLE')`, delivered, late, ancient).Scan(&gone)
	if inDefault != 4 || inYoung != 1 || gone != 0 {
		t.Errorf("%d rows in DEFAULT, %d in the young day, %d forgotten rows left; want 4, 1, 0", inDefault, inYoung, gone)
	}
	var settled *time.Time
	owner.QueryRow(ctx, `SELECT settled_at FROM outbox.dedupe WHERE dedupe_key = 'k-delivered'`).Scan(&settled)
	if settled == nil || !settled.Equal(deliveredTime) {
		t.Errorf("the delivered message's key settled at %v, want its outcome's time %v", settled, deliveredTime)
	}

	// The survivor in DEFAULT is still the message's one delivery.
	if _, err := owner.Exec(ctx, `INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic)
		VALUES ($1, 2, 'DISPATCHED', 'billing', 'usage')`, late); sqlstate(err) != "23505" {
		t.Errorf("a second delivery of a survivor in DEFAULT: %v, want a unique violation", err)
	}
	// The day left the archive; its table goes in the next pass, whose
	// commit (which truncates its files) then holds no lock of the archive.
	leftover := strings.Replace(expired, "attempts_p", "attempts_expired_", 1)
	if !exists(leftover) {
		t.Errorf("the detached day is not kept as %s for the next pass", leftover)
	}
	if err := dispatcher.QueryRow(ctx, `SELECT * FROM outbox.purge('2 days', NULL, 1000)`).Scan(&purged, &dedupe, &keys); err != nil || purged != 0 {
		t.Errorf("second purge: %d rows (%v), want 0", purged, err)
	}
	if exists(leftover) {
		t.Errorf("the second pass left %s", leftover)
	}
}

func TestArchivePartitionsAreAppendOnlyAndTheOwnersAlone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	owner := pgtest.Connect(t, db.URL)
	if _, err := owner.Exec(ctx, `SELECT outbox.ensure_archive_partitions(3)`); err != nil {
		t.Fatal(err)
	}
	archiveRow(t, owner, newID(t, owner, "now()"), "DISPATCHED", "now()", nil)
	archiveRow(t, owner, "6a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3", "RETRYABLE", "now()", nil)
	var today string
	owner.QueryRow(ctx, `SELECT 'outbox.attempts_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')`).Scan(&today)

	// Even the owner's own statements are refused, on the parent and on
	// every partition.
	if _, err := owner.Exec(ctx, `SET ROLE outbox_owner`); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"outbox.attempts", today, "outbox.attempts_default"} {
		for _, stmt := range []string{"UPDATE %s SET note = 'x'", "DELETE FROM %s", "TRUNCATE %s"} {
			sql := fmt.Sprintf(stmt, table)
			if _, err := owner.Exec(ctx, sql); sqlstate(err) != "P0001" || !strings.Contains(err.Error(), "append-only") {
				t.Errorf("%s as the owner: %v, want the append-only refusal", sql, err)
			}
		}
	}
	// A second delivery is refused whoever inserts it, wherever.
	var delivered string
	owner.QueryRow(ctx, `SELECT message_id::text FROM outbox.attempts WHERE state = 'DISPATCHED'`).Scan(&delivered)
	for _, table := range []string{"outbox.attempts", today} {
		// A partition has no identity of its own: the parent gives ids.
		if _, err := owner.Exec(ctx, `INSERT INTO `+table+` (id, message_id, attempt_no, state, namespace, topic)
			OVERRIDING SYSTEM VALUE VALUES (1000000, $1, 2, 'DISPATCHED', 'billing', 'usage')`, delivered); sqlstate(err) != "23505" {
			t.Errorf("a second delivery into %s: %v, want a unique violation", table, err)
		}
	}
	if _, err := owner.Exec(ctx, `RESET ROLE`); err != nil {
		t.Fatal(err)
	}

	// No runtime role touches a partition: not to write, read, detach or
	// drop it; readers read through the parent.
	for _, role := range []string{"outbox_dispatcher", "outbox_operator", "outbox_reader", "outbox_producer"} {
		conn := pgtest.Connect(t, db.LoginAs(t, role))
		for _, sql := range []string{
			`INSERT INTO ` + today + ` (message_id, attempt_no, state, namespace, topic) VALUES (gen_random_uuid(), 1, 'FAILED', 'a', 'b')`,
			`INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic) VALUES (gen_random_uuid(), 1, 'FAILED', 'a', 'b')`,
			`SELECT count(*) FROM ` + today,
			`SELECT count(*) FROM outbox.attempts_default`,
			`ALTER TABLE outbox.attempts DETACH PARTITION ` + today,
			`DROP TABLE ` + today,
			`DROP TABLE outbox.attempts_default`,
			`TRUNCATE ` + today,
			`DELETE FROM ` + today,
		} {
			if _, err := conn.Exec(ctx, sql); sqlstate(err) != "42501" {
				t.Errorf("%s: %s: %v, want insufficient privilege", role, sql, err)
			}
		}
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox.attempts`).Scan(&n)
		if readsArchive := role == "outbox_operator" || role == "outbox_reader"; readsArchive && (err != nil || n != 2) {
			t.Errorf("%s reads %d rows of the archive (%v), want 2", role, n, err)
		} else if !readsArchive && sqlstate(err) != "42501" {
			t.Errorf("%s reads the archive: %v, want insufficient privilege", role, err)
		}
	}
}

func TestArchiveDaysAreMadeAheadAndAMissingDayFailsNoInsert(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	owner := pgtest.Connect(t, db.URL)
	dispatcher := pgtest.Connect(t, db.LoginAs(t, "outbox_dispatcher"))
	if _, err := dispatcher.Exec(ctx, `SELECT outbox.ensure_archive_partitions(3)`); err != nil {
		t.Fatal(err)
	}
	days := func() int {
		var n int
		owner.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox.attempts'::regclass`).Scan(&n)
		return n
	}
	before := days()

	// A day with no partition: its row goes to DEFAULT.
	far := newID(t, owner, "now() + interval '7 days'")
	archiveRow(t, owner, far, "RETRYABLE", "now()", nil)
	var where string
	owner.QueryRow(ctx, `SELECT tableoid::regclass::text FROM outbox.attempts WHERE message_id = $1`, far).Scan(&where)
	if where != "outbox.attempts_default" {
		t.Fatalf("a row of a day with no partition went to %s, want outbox.attempts_default", where)
	}

	// Five days ahead more: every day but the one DEFAULT holds rows of,
	// which stays there.
	var made int
	if err := dispatcher.QueryRow(ctx, `SELECT outbox.ensure_archive_partitions(8)`).Scan(&made); err != nil {
		t.Fatal(err)
	}
	if made != 4 || days() != before+4 {
		t.Fatalf("made %d days (now %d partitions, from %d), want 4: days 4 to 8 but the 7th", made, days(), before)
	}
	if err := dispatcher.QueryRow(ctx, `SELECT outbox.ensure_archive_partitions(8)`).Scan(&made); err != nil || made != 0 {
		t.Fatalf("again: made %d (%v), want 0", made, err)
	}
	// Each day made is append-only too.
	var triggers int
	owner.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_trigger g ON g.tgrelid = i.inhrelid AND g.tgname = 'attempts_append_only'
		WHERE i.inhparent = 'outbox.attempts'::regclass`).Scan(&triggers)
	if triggers != days() {
		t.Fatalf("%d of %d partitions have the append-only trigger", triggers, days())
	}
	// The rows of days ahead land in their day.
	soon := newID(t, owner, "now() + interval '5 days'")
	archiveRow(t, owner, soon, "RETRYABLE", "now()", nil)
	owner.QueryRow(ctx, `SELECT tableoid::regclass::text FROM outbox.attempts WHERE message_id = $1`, soon).Scan(&where)
	if where == "outbox.attempts_default" {
		t.Fatalf("a row of a day made ahead went to DEFAULT")
	}

	for _, bad := range []string{"-1", "61", "NULL"} {
		if _, err := dispatcher.Exec(ctx, `SELECT outbox.ensure_archive_partitions(`+bad+`)`); sqlstate(err) != "22023" || !strings.Contains(err.Error(), "p_days_ahead") {
			t.Errorf("ensure_archive_partitions(%s): %v, want 22023 naming p_days_ahead", bad, err)
		}
	}
}

// Behind a reader holding the archive, purge does not wait (which would
// queue every completion behind it): it leaves the day for the next pass
// and does the rest of its work.
func TestPurgeLeavesADayItCannotLockToTheNextPass(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	owner := pgtest.Connect(t, db.URL)
	expired := makeDay(t, owner, 10)
	old := newID(t, owner, "now() - interval '10 days'")
	archiveRow(t, owner, old, "DISPATCHED", "now() - interval '10 days'", nil)

	reader := pgtest.Connect(t, db.LoginAs(t, "outbox_reader"))
	tx, err := reader.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox.attempts`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	dispatcher := pgtest.Connect(t, db.LoginAs(t, "outbox_dispatcher"))
	var purged, dedupe, keys int64
	if err := dispatcher.QueryRow(ctx, `SELECT * FROM outbox.purge('2 days', NULL, 1000)`).Scan(&purged, &dedupe, &keys); err != nil {
		t.Fatalf("purge behind a reader: %v, want it to leave the day", err)
	}
	var exists bool
	owner.QueryRow(ctx, `SELECT to_regclass('outbox.' || $1) IS NOT NULL`, expired).Scan(&exists)
	if purged != 0 || !exists {
		t.Fatalf("behind a reader: purged %d, day kept %v; want 0 and the day left", purged, exists)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dispatcher.QueryRow(ctx, `SELECT * FROM outbox.purge('2 days', NULL, 1000)`).Scan(&purged, &dedupe, &keys); err != nil || purged != 1 {
		t.Fatalf("the next pass: purged %d (%v), want the day's row", purged, err)
	}
}

// archiveKeys is the primary key of the archive and of each of its
// partitions, and the archive's indexes by message, as text.
func archiveKeys(t *testing.T, conn *pgx.Conn) (keys []string, byMessage bool) {
	t.Helper()
	ctx := context.Background()
	rows, err := conn.Query(ctx, `SELECT DISTINCT pg_get_constraintdef(c.oid) FROM pg_constraint c
		WHERE c.contype = 'p' AND (c.conrelid = 'outbox.attempts'::regclass
		   OR c.conrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.attempts'::regclass))`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT to_regclass('outbox.attempts_by_message') IS NOT NULL`).Scan(&byMessage); err != nil {
		t.Fatal(err)
	}
	return keys, byMessage
}

// 00015: the archive's key leads with the message, which is how every
// reader finds its rows, and the index by message it replaces goes.
func TestArchiveKeyLeadsWithTheMessageAndMigratesBothWays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, conn := migratedEmpty(t)
	if keys, byMessage := archiveKeys(t, conn); strings.Join(keys, ";") != "PRIMARY KEY (message_id, id)" || byMessage {
		t.Fatalf("archive keys %v, attempts_by_message kept: %v; want every partition keyed (message_id, id) and no index by message beside it", keys, byMessage)
	}

	// Rows in a day's partition and in DEFAULT, one message with three
	// attempts, all before the key changes back and forth.
	history := newID(t, conn, "now()")
	for _, state := range []string{"RETRYABLE", "RETRYABLE", "DISPATCHED"} {
		archiveRow(t, conn, history, state, "now()", "k-history")
	}
	archiveRow(t, conn, newID(t, conn, "now() - interval '100 days'"), "DISPATCHED", "now() - interval '99 days'", nil)
	archiveRow(t, conn, "6a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3", "FAILED", "now()", nil)
	before := archiveRows(t, conn)

	// A message's history is read through the key, in attempt order.
	var plan string
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `EXPLAIN (COSTS OFF) SELECT id FROM outbox.attempts WHERE message_id = $1 ORDER BY id`, history)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	plan = strings.Join(lines, "\n")
	if !strings.Contains(plan, "_pkey") {
		t.Fatalf("a message's history is not read through the archive's key:\n%s", plan)
	}

	if _, err := m.DownTo(ctx, 14); err != nil {
		t.Fatalf("down: %v", err)
	}
	if keys, byMessage := archiveKeys(t, conn); strings.Join(keys, ";") != "PRIMARY KEY (id, message_id)" || !byMessage {
		t.Fatalf("after down: archive keys %v, attempts_by_message: %v; want (id, message_id) and the index by message", keys, byMessage)
	}
	if after := archiveRows(t, conn); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("down changed the archive:\n%s\nwant\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if keys, byMessage := archiveKeys(t, conn); strings.Join(keys, ";") != "PRIMARY KEY (message_id, id)" || byMessage {
		t.Fatalf("after up again: archive keys %v, attempts_by_message: %v", keys, byMessage)
	}
	if after := archiveRows(t, conn); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("up changed the archive:\n%s\nwant\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	// The archive's guarantees hold on the new key: one delivery a
	// message, and nothing updated or deleted.
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.attempts (message_id, attempt_no, state, namespace, topic)
		VALUES ($1, 4, 'DISPATCHED', 'billing', 'usage')`, history); sqlstate(err) != "23505" {
		t.Fatalf("a second delivery of %s: %v, want the unique violation", history, err)
	}
	if _, err := conn.Exec(ctx, `DELETE FROM outbox.attempts WHERE message_id = $1`, history); sqlstate(err) != "P0001" {
		t.Fatalf("delete after up: %v, want the append-only refusal", err)
	}
}
