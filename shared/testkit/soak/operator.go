package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
)

// operator runs the operator's actions as an operator would: the outboxctl
// binary, a separate process per command, against the database directly.
// A command that fails while the server restarts or is read-only is run
// again, as the operator would (a usage error, exit 2, is not).
type operator struct {
	bin string
	url string
	log func(format string, args ...any)

	mu     sync.Mutex
	counts OperatorCounts
	pauses []PauseWindow
}

// OperatorCounts are what the operator did.
type OperatorCounts struct {
	Commands        int64 `json:"commands"`
	CommandRetries  int64 `json:"command_retries"`
	ReplayCommands  int64 `json:"replay_commands"`
	Replayed        int64 `json:"dead_letters_replayed"`
	ParkedReleased  int64 `json:"parked_keys_released"`
	Pauses          int64 `json:"pauses"`
	PausedHeld      int64 `json:"paused_messages_held"`
	PausedInFlight  int64 `json:"in_flight_at_pause"`
	PauseViolations int64 `json:"paused_messages_delivered"`
}

// PauseWindow is one pause of a topic: from the moment the pause had
// committed and the leases then held were listed, to the moment the resume
// was sent. No call for a message of the topic may arrive at the target in
// it, but for the messages leased (in flight) when it began.
type PauseWindow struct {
	Namespace, Topic string
	Start, End       time.Time
	Held             int64
	inFlight         map[uuid.UUID]struct{}
}

func (o *operator) add(f func(*OperatorCounts)) {
	o.mu.Lock()
	f(&o.counts)
	o.mu.Unlock()
}

// Counts returns the operator's counters.
func (o *operator) Counts() OperatorCounts {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts
}

// run runs outboxctl with args and returns its standard output, retrying a
// failure other than a usage error for up to two minutes.
func (o *operator) run(ctx context.Context, args ...string) ([]byte, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, o.bin, append([]string{"--database-url", o.url}, args...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		o.add(func(c *OperatorCounts) { c.Commands++ })
		if err == nil {
			return stdout.Bytes(), nil
		}
		var exit *exec.ExitError
		if ctx.Err() != nil || time.Now().After(deadline) || (errors.As(err, &exit) && exit.ExitCode() == 2) {
			return nil, fmt.Errorf("outboxctl %v: %v: %s", args, err, bytes.TrimSpace(stderr.Bytes()))
		}
		o.add(func(c *OperatorCounts) { c.CommandRetries++ })
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// deadLetters lists up to 1000 dead letters, oldest first (outboxctl dead
// list --json, with filter's flags).
func (o *operator) deadLetters(ctx context.Context, filter ...string) ([]struct {
	ID          uuid.UUID `json:"id"`
	OrderingKey string    `json:"ordering_key"`
	HoldsKey    bool      `json:"holds_key"`
}, error) {
	out, err := o.run(ctx, append([]string{"dead", "list", "--json", "--limit", "1000"}, filter...)...)
	if err != nil {
		return nil, err
	}
	var page struct {
		Letters []struct {
			ID          uuid.UUID `json:"id"`
			OrderingKey string    `json:"ordering_key"`
			HoldsKey    bool      `json:"holds_key"`
		} `json:"dead_letters"`
	}
	if err := json.Unmarshal(out, &page); err != nil {
		return nil, fmt.Errorf("outboxctl dead list --json: %w: %.200s", err, out)
	}
	return page.Letters, nil
}

// replayDead replays the dead letters the failing target produced: those
// without an ordering key (the target is "fixed"), and the parked heads
// (on_dead: park), which release their keys. An ordered dead letter of a
// skip route stays dead: its key went on without it, and replaying it
// would deliver it out of order — what an operator of a payment stream
// would not do (and what the order check would rightly count).
// unorderedToo false replays only the parked heads.
//
// The listings are filtered so that the letters left dead for good (the
// skip route's ordered ones) cannot fill the 1,000 a listing shows and
// hide those to replay: transfer's letters are all replayed (its route
// parks), and usage_record's are looked at for the last two minutes only.
func (o *operator) replayDead(ctx context.Context, unorderedToo bool) error {
	letters, err := o.deadLetters(ctx, "--topic", "transfer")
	if err != nil {
		return err
	}
	if unorderedToo {
		more, err := o.deadLetters(ctx, "--topic", "usage_record", "--failed-after", "2m")
		if err != nil {
			return err
		}
		letters = append(letters, more...)
	}
	args := []string{"replay", "--yes", "--reason", "soak: the target is fixed"}
	var n, parked int64
	for _, l := range letters {
		switch {
		case l.HoldsKey:
			parked++
		case l.OrderingKey == "" && unorderedToo:
		default:
			continue
		}
		n++
		args = append(args, "--id", l.ID.String())
	}
	if n == 0 {
		return nil
	}
	args = append(args, "--limit", strconv.FormatInt(n, 10))
	if _, err := o.run(ctx, args...); err != nil {
		return err
	}
	o.add(func(c *OperatorCounts) {
		c.ReplayCommands++
		c.Replayed += n
		c.ParkedReleased += parked
	})
	return nil
}

// pause pauses a topic, lists what is in flight and what is held, waits
// for d and resumes it.
func (o *operator) pause(ctx context.Context, flt *fleet, namespace, topic string, d time.Duration, n int) error {
	reason := fmt.Sprintf("soak: pause %d of %s/%s", n, namespace, topic)
	// A lease held just before the pause may be given up before the
	// listing below (a call timed out, a lease taken over) while its call
	// still reaches the target: those are in flight too.
	before := time.Now()
	leasedBefore := flt.leased(ctx, leasedSQL+` WHERE h.lease_token IS NOT NULL`)
	if _, err := o.run(ctx, "pause", "--namespace", namespace, "--topic", topic, "--reason", reason); err != nil {
		return err
	}
	// Every lease held now was taken before the pause committed: those
	// messages may still be delivered. Their ordered runs are in flight
	// too, whatever their topic.
	leased := flt.leased(ctx, leasedSQL+` WHERE h.lease_token IS NOT NULL`)
	w := PauseWindow{Namespace: namespace, Topic: topic, Start: time.Now(), inFlight: map[uuid.UUID]struct{}{}}
	for _, id := range append(leased, leasedBefore...) {
		w.inFlight[id] = struct{}{}
	}
	if err := flt.admin.QueryRow(ctx, `SELECT count(*) FROM outbox.pending WHERE namespace = $1 AND topic = $2 AND NOT (id = ANY($3))`,
		namespace, topic, leased).Scan(&w.Held); err != nil {
		o.log("pause %d: counting the held messages: %v", n, err)
	}
	o.log("paused %s/%s: %d messages held, %d leased in flight", namespace, topic, w.Held, len(leased))
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
	}
	w.End = time.Now()
	// A worker whose lease expired or whose call the dispatcher gave up
	// on may still be calling the target (a zombie, a slow answer): the
	// pause holds what is claimed after it, and cannot recall a call
	// already made. Their messages' deliveries in the window are theirs.
	zombies := flt.leased(ctx, `SELECT DISTINCT message_id FROM outbox.attempts
		WHERE namespace = $1 AND topic = $2 AND created_at BETWEEN $3 AND $4
		  AND (state = 'ZOMBIE_REQUEUE' OR (state = 'RETRYABLE' AND error_code IN ('TIMEOUT', 'CANCELED')))`,
		namespace, topic, before.Add(-2*time.Minute), w.End)
	for _, id := range zombies {
		w.inFlight[id] = struct{}{}
	}
	if _, err := o.run(ctx, "resume", "--namespace", namespace, "--topic", topic, "--reason", reason+" over"); err != nil {
		return err
	}
	o.mu.Lock()
	o.pauses = append(o.pauses, w)
	o.counts.Pauses++
	o.counts.PausedHeld += w.Held
	o.counts.PausedInFlight += int64(len(w.inFlight))
	o.mu.Unlock()
	o.log("resumed %s/%s after %s", namespace, topic, d)
	return nil
}

// Windows returns the completed pauses.
func (o *operator) Windows() []PauseWindow {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]PauseWindow(nil), o.pauses...)
}
