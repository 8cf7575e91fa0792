package logging_test

import (
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/outboxkit/dispatcher/shared/telemetry/logging"
)

// The price of the Powertools keys and the redaction, next to slog's own
// JSON handler, for a typical dispatcher line.
func BenchmarkLogLine(b *testing.B) {
	err := errors.New("503 Service Unavailable")
	for name, log := range map[string]*slog.Logger{
		"slog.JSONHandler": slog.New(slog.NewJSONHandler(io.Discard, nil)).With("service", "outbox-dispatch"),
		"logging.New":      logging.New(io.Discard, "outbox-dispatch", slog.LevelInfo),
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				log.Warn("publish failed", "message_id", "0190a3c4-5d6e-7f80-9a0b-1c2d3e4f5a6b",
					"code", "TARGET_5XX", "attempt", 3, "error", err)
			}
		})
	}
	b.Run("logging.New/below level", func(b *testing.B) {
		log := logging.New(io.Discard, "outbox-dispatch", slog.LevelWarn)
		b.ReportAllocs()
		for b.Loop() {
			log.Info("claimed", "claimed", 500)
		}
	})
}
