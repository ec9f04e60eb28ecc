package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
)

// orDefault returns l, or when l is nil the DefaultLogger on stderr: a
// service that supplies no logger still reports its warnings and errors.
func orDefault(l *slog.Logger) *slog.Logger {
	if l == nil {
		return DefaultLogger(os.Stderr)
	}
	return l
}

// errStopRequested is the cause of a start hook's context when the
// application is asked to stop while it starts.
var errStopRequested = errors.New("stop requested while starting")

// stopRequestKey keys, in the context Serve starts the application with, a
// context that ends when a signal asks the application to stop.
type stopRequestKey struct{}

// withStopRequest returns ctx carrying stop, for the start hooks.
//
// fx's Start returns as soon as its own context ends, while a hook still
// runs, and rolls nothing back: Serve cannot cancel it without racing the
// stop hooks. Instead the hooks that may wait long (for the broker, for
// the router's handlers) end their wait on stop through
// untilStopRequested, and fail; fx then rolls back the hooks that started,
// in order.
func withStopRequest(ctx, stop context.Context) context.Context {
	return context.WithValue(ctx, stopRequestKey{}, stop)
}

// untilStopRequested returns a context that ends with ctx, or with cause
// errStopRequested when ctx carries a stop request (see withStopRequest)
// that comes first.
func untilStopRequested(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop, ok := ctx.Value(stopRequestKey{}).(context.Context)
	if !ok {
		return ctx, func() { cancel(nil) }
	}
	unhook := context.AfterFunc(stop, func() { cancel(errStopRequested) })
	return ctx, func() {
		unhook()
		cancel(nil)
	}
}
