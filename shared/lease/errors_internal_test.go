package lease

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// The archive is partitioned by day: a second delivery is reported on the
// day's own index, and is still a double delivery.
func TestASecondDeliveryIsRecognisedOnEveryPartitionsIndex(t *testing.T) {
	for _, index := range []string{"attempts_one_dispatched_per_message", "attempts_p20260101_one_dispatched_per_message",
		"attempts_default_one_dispatched_per_message"} {
		err := translate("complete", &pgconn.PgError{Code: "23505", ConstraintName: index})
		if !errors.Is(err, ErrDoubleDispatch) {
			t.Errorf("23505 on %s: %v, want ErrDoubleDispatch", index, err)
		}
	}
	if err := translate("complete", &pgconn.PgError{Code: "23505", ConstraintName: "dedupe_pkey"}); errors.Is(err, ErrDoubleDispatch) {
		t.Errorf("23505 on dedupe_pkey: %v, want no double delivery", err)
	}
}
