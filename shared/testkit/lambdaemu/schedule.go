package lambdaemu

import (
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ScheduleConfig is an EventBridge Scheduler schedule that invokes a
// function asynchronously, as the template's ScheduleV2 events do.
type ScheduleConfig struct {
	// Function is the target's name.
	Function string
	// Expression is the deployment's rate expression, e.g. "rate(1 minute)"
	// (cron expressions are not emulated).
	Expression string
	// Compression runs the schedule faster than real time: a tick every
	// rate / Compression (default 1, real time). Reports must say so.
	Compression float64
	// Payload is the event (default "{}", the template's Input and
	// events/dispatch-schedule.json).
	Payload []byte
	// FirstTickAfter is the wait before the first tick (default one
	// period: a rate schedule first fires one rate after it starts).
	FirstTickAfter time.Duration
}

// Schedule is a running schedule.
type Schedule struct {
	cfg   ScheduleConfig
	rate  time.Duration
	every time.Duration
	ticks atomic.Int64
	stop  chan struct{}
	once  sync.Once
	done  chan struct{}
}

var rateExpression = regexp.MustCompile(`^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$`)

// ParseRate reads an EventBridge rate expression, e.g. "rate(5 minutes)".
func ParseRate(expr string) (time.Duration, error) {
	m := rateExpression.FindStringSubmatch(expr)
	if m == nil {
		return 0, fmt.Errorf("lambdaemu: %q is not a rate expression such as rate(1 minute) or rate(5 minutes)", expr)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n < 1 {
		return 0, fmt.Errorf("lambdaemu: %q: the rate must be a positive whole number", expr)
	}
	unit := map[string]time.Duration{"minute": time.Minute, "minutes": time.Minute, "hour": time.Hour, "hours": time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour}[m[2]]
	return time.Duration(n) * unit, nil
}

// Schedule starts a schedule; it stops at Stop or Close.
func (e *Emulator) Schedule(cfg ScheduleConfig) (*Schedule, error) {
	f, err := e.lookup(cfg.Function)
	if err != nil {
		return nil, err
	}
	rate, err := ParseRate(cfg.Expression)
	if err != nil {
		return nil, err
	}
	if cfg.Compression == 0 {
		cfg.Compression = 1
	}
	if cfg.Compression < 1 {
		return nil, fmt.Errorf("lambdaemu: a schedule's Compression must be at least 1, got %g", cfg.Compression)
	}
	if cfg.Payload == nil {
		cfg.Payload = []byte("{}")
	}
	s := &Schedule{cfg: cfg, rate: rate, every: time.Duration(float64(rate) / cfg.Compression), stop: make(chan struct{}), done: make(chan struct{})}
	if cfg.FirstTickAfter == 0 {
		cfg.FirstTickAfter = s.every
	}
	if !e.goBackground(func() { s.run(e, f, cfg.FirstTickAfter) }) {
		return nil, ErrClosed
	}
	return s, nil
}

// run ticks on a fixed grid from the start, so that a slow tick does not
// shift the later ones.
func (s *Schedule) run(e *Emulator, f *function, first time.Duration) {
	defer close(s.done)
	start := time.Now().Add(first)
	for n := 0; ; n++ {
		timer := time.NewTimer(time.Until(start.Add(time.Duration(n) * s.every)))
		select {
		case <-timer.C:
		case <-s.stop:
			timer.Stop()
			return
		case <-e.ctx.Done():
			timer.Stop()
			return
		}
		if _, err := e.enqueue(f, s.cfg.Payload, TriggerSchedule); err != nil {
			return
		}
		s.ticks.Add(1)
	}
}

// Stop ends the schedule; no tick follows its return.
func (s *Schedule) Stop() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// Ticks is the number of invocations the schedule has queued.
func (s *Schedule) Ticks() int { return int(s.ticks.Load()) }

// Every is the real time between ticks.
func (s *Schedule) Every() time.Duration { return s.every }

// String says what the schedule runs, compression included, e.g.
// "rate(1 minute) compressed ×12: a tick every 5s".
func (s *Schedule) String() string {
	if s.cfg.Compression == 1 {
		return fmt.Sprintf("%s in real time: a tick every %s", s.cfg.Expression, s.every)
	}
	return fmt.Sprintf("%s compressed ×%g: a tick every %s", s.cfg.Expression, s.cfg.Compression, s.every)
}
