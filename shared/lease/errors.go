package lease

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinels for the outbox functions' SQLSTATEs. Test with errors.Is; the
// *Error that carries them also unwraps to the *pgconn.PgError.
var (
	// ErrLeaseLost (SQLSTATE P7002): the message is no longer leased to this
	// worker under this token — the lease expired and was repaired, or the
	// message was already completed. Nothing was written.
	ErrLeaseLost = errors.New("lease: lease lost")
	// ErrInvalidCompletion (P7003): a malformed completion (unknown outcome,
	// missing id or token, a message twice in one batch). Nothing was written.
	ErrInvalidCompletion = errors.New("lease: invalid completion")
	// ErrInvalidArgument (22023): an argument out of range, such as a batch
	// size of 0.
	ErrInvalidArgument = errors.New("lease: invalid argument")
	// ErrRefused (P7005): an operator action refused for the state of what
	// it names — a message leased, delivered or dead, a namespace not
	// paused or paused already. The error names each and why; nothing
	// was written.
	ErrRefused = errors.New("lease: operator action refused")
	// ErrAppendOnly (P0001): an UPDATE or DELETE on outbox.attempts.
	ErrAppendOnly = errors.New("lease: the attempts archive is append-only")
	// ErrDoubleDispatch (23505 on attempts_one_dispatched_per_message): a
	// second DISPATCHED outcome for one message. The batch was rolled back.
	// It means a delivery was about to be recorded twice: a bug to report.
	ErrDoubleDispatch = errors.New("lease: message already recorded as dispatched (double-delivery backstop)")
)

// The SQLSTATEs of the outbox functions (docs/DATABASE.md).
const (
	sqlstateLeaseLost         = "P7002"
	sqlstateInvalidCompletion = "P7003"
	sqlstateRefused           = "P7005"
	sqlstateAppendOnly        = "P0001"
	sqlstateInvalidParameter  = "22023"
	sqlstateUniqueViolation   = "23505"

	doubleDispatchSuffix = "_one_dispatched_per_message"
)

// Error is a database error from one store operation, classified.
type Error struct {
	// Op is the store operation: claim, complete, repair, replay, stats, purge.
	Op string
	// Kind is one of the sentinels above, or nil for an unclassified error
	// (a lost connection, a timeout).
	Kind error
	// Err is the underlying error, usually a *pgconn.PgError.
	Err error
}

func (e *Error) Error() string {
	if e.Kind != nil {
		return fmt.Sprintf("%s (%s): %v", e.Kind, e.Op, e.Err)
	}
	return fmt.Sprintf("lease: %s: %v", e.Op, e.Err)
}

// Unwrap exposes both the sentinel and the driver error.
func (e *Error) Unwrap() []error {
	if e.Kind != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Err}
}

// translate is the one place where SQLSTATEs become our errors.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return &Error{Op: op, Err: err}
	}
	var kind error
	switch pgErr.Code {
	case sqlstateLeaseLost:
		kind = ErrLeaseLost
	case sqlstateInvalidCompletion:
		kind = ErrInvalidCompletion
	case sqlstateInvalidParameter:
		kind = ErrInvalidArgument
	case sqlstateRefused:
		kind = ErrRefused
	case sqlstateAppendOnly:
		kind = ErrAppendOnly
	case sqlstateUniqueViolation:
		// The archive's partitions report their own index, named after
		// the partition (attempts_p20260101_one_dispatched_per_message).
		if strings.HasSuffix(pgErr.ConstraintName, doubleDispatchSuffix) {
			kind = ErrDoubleDispatch
		}
	}
	return &Error{Op: op, Kind: kind, Err: err}
}
