package app

import (
	"io"
	"log/slog"
	"os"
)

// DefaultLogger returns the logger of a service that is given none: it
// writes warnings and errors to w (a dead letter, a nack, a broker or
// database that fails), as text when w is a character device such as a
// terminal, and as one JSON object per line otherwise, for a log
// collector. New, Main and Serve log so to stderr unless the application
// supplies a *slog.Logger, which then receives everything:
//
//	app.Main("notifications", fx.Options(
//		fx.Supply(slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelInfo}))),
//		...
//	))
//
// At info level a service also logs each failed attempt with its error; at
// debug level every message handled.
func DefaultLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelWarn}
	if isTerminal(w) {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// isTerminal reports whether w is a character device, as a terminal is.
func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Stat() (os.FileInfo, error) })
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
