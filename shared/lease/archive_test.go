package lease_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxkit/dispatcher/shared/lease"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

func TestEnsureArchivePartitionsMakesTheMissingDaysOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := lease.NewStore(pgtest.Pool(t, db.LoginAs(t, "outbox_dispatcher")))
	if _, err := store.EnsureArchivePartitions(ctx, lease.ArchiveDaysAhead); err != nil {
		t.Fatal(err)
	}
	// The last two days ahead go missing (dropped by hand).
	for _, ahead := range []int{2, 3} {
		var stmt string
		db.Pool.QueryRow(ctx, `SELECT format('DROP TABLE outbox.attempts_p%s', to_char((now() AT TIME ZONE 'UTC')::date + $1::int, 'YYYYMMDD'))`, ahead).Scan(&stmt)
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if made, err := store.EnsureArchivePartitions(ctx, lease.ArchiveDaysAhead); err != nil || made != 2 {
		t.Fatalf("made %d (%v), want the 2 missing days", made, err)
	}
	if made, err := store.EnsureArchivePartitions(ctx, lease.ArchiveDaysAhead); err != nil || made != 0 {
		t.Fatalf("again: made %d (%v), want 0", made, err)
	}
	if _, err := store.EnsureArchivePartitions(ctx, 61); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("61 days ahead: %v, want ErrInvalidArgument", err)
	}
}
