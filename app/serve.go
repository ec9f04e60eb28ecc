package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
)

// New returns the fx application of Module and opts (the service's
// consumers, dependencies and supplied values). fx's own events are logged
// at debug level to the supplied *slog.Logger, if any.
//
// When the application fails to build (a bad configuration, a duplicate
// consumer), what the constructors that did run opened (the database, the
// transport) is closed before New returns.
func New(opts ...fx.Option) *fx.App {
	var undo cleanup
	return build(&undo, Module, fx.Options(opts...),
		// Last, once every constructor of the service ran: a service:
		// section that none of them decoded is refused.
		fx.Invoke(func(cfg Config) error { return cfg.checkServiceDecoded() }))
}

// build returns the fx application of opts with the framework's logger,
// recording into undo the stop-only hooks of its constructors, which it
// runs when the application fails to build (see New).
//
// fx's own events are logged at debug level, its errors too: every error
// fx would log is also returned, by Err, Start or Stop, and reported once
// by whoever receives it (Main prints it as one line).
func build(undo *cleanup, opts ...fx.Option) *fx.App {
	app := fx.New(
		fx.Options(opts...),
		fx.Decorate(undo.record),
		fx.WithLogger(func(p struct {
			fx.In
			Logger *slog.Logger `optional:"true"`
		},
		) fxevent.Logger {
			if p.Logger == nil {
				return fxevent.NopLogger
			}
			l := &fxevent.SlogLogger{Logger: p.Logger}
			l.UseLogLevel(slog.LevelDebug)
			l.UseErrorLevel(slog.LevelDebug)
			return l
		}),
	)
	if app.Err() != nil {
		undo.run()
	}
	return app
}

// cleanup records the stop-only hooks (fx.StopHook) that constructors
// append, to run them when the application fails to build: fx runs stop
// hooks only after a start, and a constructor that opened a database
// before a later one failed would leak it.
type cleanup struct {
	mu    sync.Mutex
	hooks []fx.Hook
}

// record decorates the lifecycle the constructors see.
func (c *cleanup) record(lc fx.Lifecycle) fx.Lifecycle {
	return recordingLifecycle{Lifecycle: lc, cleanup: c}
}

// run runs the recorded hooks, the last appended first.
func (c *cleanup) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.hooks) - 1; i >= 0; i-- {
		_ = c.hooks[i].OnStop(context.Background()) // best effort: the build error is what matters
	}
	c.hooks = nil
}

type recordingLifecycle struct {
	fx.Lifecycle
	cleanup *cleanup
}

// Append appends h, and records it when it only stops.
func (l recordingLifecycle) Append(h fx.Hook) {
	if h.OnStart == nil && h.OnStop != nil {
		l.cleanup.mu.Lock()
		l.cleanup.hooks = append(l.cleanup.hooks, h)
		l.cleanup.mu.Unlock()
	}
	l.Lifecycle.Append(h)
}

// Serve starts app, runs until ctx ends or the process receives SIGINT or
// SIGTERM, then stops it gracefully: the router cancels the attempts in
// flight, which roll back and are delivered again later.
//
// An error of the build or the start reads as its cause alone, without
// fx's chain of constructors (see Main); it still unwraps to the whole
// chain.
func Serve(ctx context.Context, app *fx.App) error {
	if err := app.Err(); err != nil {
		return explain(err)
	}
	// Signals are caught from before the start: the handlers run before
	// the start ends.
	sigCtx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// The start is bounded by its timeout, not by ctx: fx's Start returns
	// as soon as its context ends, even while a hook runs, and leaves the
	// application running. A stop asked for during the start (a signal, or
	// ctx ending) reaches the hooks that wait (see withStopRequest): they
	// give up, fx rolls the start back, and Serve returns nil.
	startCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), app.StartTimeout())
	defer cancel()
	if err := app.Start(withStopRequest(startCtx, sigCtx)); err != nil {
		// fx rolls back a start whose hook failed, but not one cut short
		// by its timeout: stop whatever started (a no-op after a rollback).
		stopCtx, cancelStop := context.WithTimeout(context.Background(), app.StopTimeout())
		defer cancelStop()
		_ = app.Stop(stopCtx) // the start's error is what matters
		if sigCtx.Err() != nil && startCtx.Err() == nil {
			return nil // asked to stop while starting: stopped
		}
		return fmt.Errorf("start: %w", explain(err))
	}
	select {
	case <-sigCtx.Done():
	case sig := <-app.Wait():
		if sig.ExitCode != 0 {
			defer os.Exit(sig.ExitCode)
		}
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), app.StopTimeout())
	defer cancel()
	if err := app.Stop(stopCtx); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	return nil
}

// serve builds the application of opts and serves it (see Serve). Signals
// are caught from before the build, which opens the database and may
// migrate it: a stop asked for meanwhile (SIGINT, SIGTERM, ctx ending)
// ends the wait for the database or the migration, which rolls back, and
// serve returns nil, as for a stop during the start. Without, SIGTERM
// killed the process while it waited for its database.
func serve(ctx context.Context, opts fx.Option) error {
	buildCtx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop() // after Serve: it catches them too, from before the start
	app := New(opts, fx.Supply(buildContext{buildCtx}))
	if buildCtx.Err() != nil {
		return nil // asked to stop while building: nothing started
	}
	return Serve(ctx, app)
}

// buildContext is what the constructors that wait (for the database, for
// a migration) wait under while the application builds (see serve); none
// outside serve.
type buildContext struct{ context.Context }

// orBackground returns c's context, or context.Background when there is
// none.
func (c buildContext) orBackground() context.Context {
	if c.Context == nil {
		return context.Background()
	}
	return c.Context
}
