// Package watermilllog adapts log/slog to watermill's LoggerAdapter, as
// watermill.NewSlogLogger does, but looks at the level first: watermill's
// own adapter turns a call's fields into slog attributes before slog
// drops a disabled level, and its router logs twice at trace level for
// every message it handles (about 250 bytes of garbage a message, a
// thirtieth of the SQLite consumer's allocations).
package watermilllog

import (
	"context"
	"errors"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// Logger is a watermill.LoggerAdapter over a slog.Logger.
type Logger struct {
	slog *slog.Logger
	next watermill.LoggerAdapter // watermill's adapter of the same logger
}

var _ watermill.LoggerAdapter = Logger{}

// New returns the adapter of l; nil stands for slog.Default().
func New(l *slog.Logger) Logger {
	if l == nil {
		l = slog.Default()
	}
	return Logger{slog: l, next: watermill.NewSlogLogger(l)}
}

// routerHandlerError is the line watermill's router logs for every
// message whose handler returned an error.
const routerHandlerError = "Handler returned error"

// Error logs at slog.LevelError, but the router's line for a message that
// is to be delivered again later on purpose (pipeline.ErrLater: a
// strict_order wait, a circuit breaker's hold), which the chain logs
// itself at info: the router's is logged at debug, so that an expected
// wait does not show as an error.
func (l Logger) Error(msg string, err error, fields watermill.LogFields) {
	if msg == routerHandlerError && errors.Is(err, pipeline.ErrLater) {
		if l.enabled(slog.LevelDebug) {
			l.next.Debug(msg, fields.Add(watermill.LogFields{"error": err}))
		}
		return
	}
	if l.enabled(slog.LevelError) {
		l.next.Error(msg, err, fields)
	}
}

// Info logs at slog.LevelInfo.
func (l Logger) Info(msg string, fields watermill.LogFields) {
	if l.enabled(slog.LevelInfo) {
		l.next.Info(msg, fields)
	}
}

// Debug logs at slog.LevelDebug.
func (l Logger) Debug(msg string, fields watermill.LogFields) {
	if l.enabled(slog.LevelDebug) {
		l.next.Debug(msg, fields)
	}
}

// Trace logs at watermill.LevelTrace, below slog.LevelDebug.
func (l Logger) Trace(msg string, fields watermill.LogFields) {
	if l.enabled(watermill.LevelTrace) {
		l.next.Trace(msg, fields)
	}
}

// With returns a logger that adds fields to every entry.
func (l Logger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	// The fields do not change which levels are enabled: slog asks the
	// handler, whatever its attributes.
	return Logger{slog: l.slog, next: l.next.With(fields)}
}

// enabled reports whether l logs at level, as slog.Logger.Log asks
// before it writes.
func (l Logger) enabled(level slog.Level) bool {
	return l.slog.Enabled(context.Background(), level)
}
