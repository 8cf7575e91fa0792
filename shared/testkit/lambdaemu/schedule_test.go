package lambdaemu_test

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string]time.Duration{
		"rate(1 minute)": time.Minute, "rate(5 minutes)": 5 * time.Minute, "rate(2 hours)": 2 * time.Hour, "rate(1 day)": 24 * time.Hour,
	} {
		if got, err := lambdaemu.ParseRate(expr); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %s, %v; want %s", expr, got, err, want)
		}
	}
	for _, expr := range []string{"rate(0 minutes)", "cron(0 * * * ? *)", "rate(1 second)", "1m"} {
		if _, err := lambdaemu.ParseRate(expr); err == nil {
			t.Errorf("ParseRate(%q) accepted it", expr)
		}
	}
}

func TestCompressedScheduleInvokesAsynchronously(t *testing.T) {
	t.Parallel()
	e := newEmulator(t, lambdaemu.Options{})
	register(t, e, "probe", lambdaemu.FunctionConfig{})
	s, err := e.Schedule(lambdaemu.ScheduleConfig{Function: "probe", Expression: "rate(1 minute)", Compression: 300})
	if err != nil {
		t.Fatal(err)
	}
	if s.Every() != 200*time.Millisecond || !strings.Contains(s.String(), "rate(1 minute) compressed ×300: a tick every 200ms") {
		t.Errorf("schedule %q every %s", s, s.Every())
	}
	eventually(t, 30*time.Second, "three ticks", func() bool { return s.Ticks() >= 3 })
	s.Stop()
	ticks := s.Ticks()
	waitIdle(t, e, "probe", 30*time.Second)
	invs := invocations(t, e, "probe")
	if len(invs) != ticks {
		t.Fatalf("%d ticks, %d invocations", ticks, len(invs))
	}
	for _, inv := range invs {
		if inv.Type != lambdaemu.Event || inv.Trigger != lambdaemu.TriggerSchedule || string(inv.Payload) != "{}" {
			t.Errorf("a tick's invocation: %+v", inv)
		}
	}
}
