package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/fx"
	"go.uber.org/goleak"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/crash"
)

// The test binary doubles as the notifications service: when
// EFFECTIVELY_CRASH_MODE is set, TestMain runs the service's command line
// (the same as main, with the process's arguments) instead of the tests,
// with a crash hook that makes the process die, or block, at one precise
// step. The hook is the one the test kit uses (testkit.CrashHook, the
// framework's crash points), put on every message's context by a router
// middleware; it kills the process instead of returning. The crash tests
// start the service as a subprocess (see crash_test.go).
const (
	envCrashMode = "EFFECTIVELY_CRASH_MODE"
	// envCrashMarker names a file the hook creates before it fires: the
	// hook fires only while the file does not exist, so the process
	// restarted after the crash runs normally.
	envCrashMarker = "EFFECTIVELY_CRASH_MARKER"
	// envCrashConsumer, when set, names the reminder consumer instead of
	// ConsumerName: tests that share a broker give each service a queue
	// of its own.
	envCrashConsumer = "EFFECTIVELY_CRASH_CONSUMER"
	// envCrashReady names a file the service creates once it starts: from
	// then on it stops gracefully on SIGTERM.
	envCrashReady = "EFFECTIVELY_CRASH_READY"
)

// The crash modes.
const (
	// modeNone runs the service as main does.
	modeNone = "none"
	// modeBeforeCommit kills the process at crash point BeforeCommit:
	// inside the attempt's transaction, after the handler's writes and
	// the processed mark, before commit.
	modeBeforeCommit = "before-commit"
	// modeBeforeAck kills the process at crash point BeforeAck: after the
	// transaction committed, before the message is acknowledged. It needs
	// the transport in a file of its own: otherwise the ack is part of
	// the transaction.
	modeBeforeAck = "before-ack"
	// modeEveryDelivery kills the process on every delivery of the event
	// crashMeID, at crash point BeforeCommit.
	modeEveryDelivery = "every-delivery"
	// modeBlock blocks the attempt at crash point BeforeCommit, after the
	// handler's writes, until the message's context ends (the service is
	// shutting down).
	modeBlock = "block"
)

// crashMeID is the id of the event that kills the process in
// modeEveryDelivery.
const crashMeID = "crash-me"

// afterCrashID is the id of the innocent event that modeEveryDelivery
// holds in flight when crash-me kills the process.
const afterCrashID = "after-crash"

// crashGrace bounds how long crash-me and afterCrashID wait for each
// other: longer than the subscriber's poll (1 s), since the two may be
// claimed one poll apart.
const crashGrace = 2 * time.Second

func TestMain(m *testing.M) {
	if mode, ok := os.LookupEnv(envCrashMode); ok {
		os.Exit(runService(mode, os.Getenv(envCrashMarker), os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// runService runs the service's command line with args and the hook of
// mode, and returns the exit code, as app.Main would.
func runService(mode, marker string, args []string) int {
	hook, mw, err := crashHook(mode, marker)
	if err != nil {
		fmt.Fprintf(os.Stderr, "notifications: %v\n", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	module := Module
	if name := os.Getenv(envCrashConsumer); name != "" {
		module = fx.Options(
			handlers.Register(name, handlers.On(appointments.Booked, rejecting(os.Getenv(envCrashReject), os.Getenv(envCrashEvent), remindHandler()))),
			fx.Supply(app.Migrations{FS: mustSub(migrations, "migrations")}),
		)
	}
	cmd := app.Command("notifications", fx.Options(module, fx.Supply(mw), fx.Supply(logger), fx.Invoke(readyFile), installHook(hook)), demoCommand())
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "notifications: %v\n", err)
		return 1
	}
	return 0
}

// readyFile creates the file named by envCrashReady, if any, when the
// application starts: app.Serve catches the signals from before the start.
func readyFile(lc fx.Lifecycle) {
	path := os.Getenv(envCrashReady)
	if path == "" {
		return
	}
	lc.Append(fx.StartHook(func() error {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			return fmt.Errorf("%s: %w", envCrashReady, err)
		}
		return nil
	}))
}

// installHook puts hook, when not nil, on the context of every message
// the service handles, before the consumer's chain, and on the context of
// the service's relays: the framework calls it at each crash point.
func installHook(hook testkit.CrashHook) fx.Option {
	if hook == nil {
		return fx.Options()
	}
	return fx.Options(fx.Supply(crash.Relays{Hook: hook}), fx.Invoke(func(r *runner.Runner) {
		r.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				msg.SetContext(testkit.WithCrashHook(msg.Context(), hook))
				return next(msg)
			}
		})
	}))
}

// crashHook returns the crash hook of mode, and the middleware some modes
// need besides to line deliveries up.
func crashHook(mode, marker string) (testkit.CrashHook, app.Middleware, error) {
	if mode == modePoints {
		hook, err := pointsHook(marker, os.Getenv(envCrashAt), os.Getenv(envCrashEvent))
		return hook, app.Middleware{}, err
	}
	if hook, ok, err := batchHookOf(mode, marker); ok {
		return hook, app.Middleware{}, err
	}
	if hook, ok, err := armedHookOf(mode); ok {
		return hook, app.Middleware{}, err
	}
	// at kills the process once (see firstTime) at point p.
	at := func(p testkit.CrashPoint) testkit.CrashHook {
		return func(_ context.Context, q testkit.CrashPoint) bool {
			if q == p && firstTime(marker) {
				killSelf()
			}
			return false
		}
	}
	switch mode {
	case modeNone:
		return nil, app.Middleware{}, nil
	case modeBeforeCommit:
		return at(testkit.BeforeCommit), app.Middleware{}, nil
	case modeBeforeAck:
		return at(testkit.BeforeAck), app.Middleware{}, nil
	case modeEveryDelivery:
		hook, mw := everyDelivery()
		return hook, mw, nil
	case modeBlock:
		return func(ctx context.Context, p testkit.CrashPoint) bool {
			if p == testkit.BeforeCommit && firstTime(marker) {
				<-ctx.Done() // the attempt then fails: it was cut short
			}
			return false
		}, app.Middleware{}, nil
	}
	return nil, app.Middleware{}, fmt.Errorf("%s: unknown mode %q", envCrashMode, mode)
}

// everyDelivery returns the hook of modeEveryDelivery: crash-me kills the
// process before its attempt commits, and the message afterCrashID is in
// flight, past the delivery guard and not committed, when it does.
//
// Each of the two waits for the other in the first Outer step, right
// after the guard: crash-me until after-crash got there, after-crash until
// crash-me's attempt wrote its processed mark (from then on it holds
// SQLite's write lock until the kill, so no other attempt commits). When
// the other does not come (not delivered, or waiting for its turn in the
// guard) each goes on after crashGrace.
func everyDelivery() (testkit.CrashHook, app.Middleware) {
	var (
		arrived, crashing = make(chan struct{}), make(chan struct{})
		arrive, crash     sync.Once
	)
	wait := func(msg *message.Message, ch <-chan struct{}) error {
		grace := time.NewTimer(crashGrace)
		defer grace.Stop()
		select {
		case <-ch:
		case <-grace.C:
		case <-msg.Context().Done():
			return msg.Context().Err()
		}
		return nil
	}
	meet := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			var err error
			switch eventID(msg.Context()) {
			case crashMeID:
				err = wait(msg, arrived)
			case afterCrashID:
				arrive.Do(func() { close(arrived) })
				err = wait(msg, crashing)
			}
			if err != nil {
				return nil, err
			}
			return next(msg)
		}
	}
	hook := func(ctx context.Context, p testkit.CrashPoint) bool {
		if eventID(ctx) != crashMeID {
			return false
		}
		switch p {
		case testkit.AfterMark:
			crash.Do(func() { close(crashing) })
		case testkit.BeforeCommit:
			killSelf()
		}
		return false
	}
	return hook, app.Middleware{Outer: []message.HandlerMiddleware{meet}}
}

// eventID returns the id of the event ctx carries.
func eventID(ctx context.Context) string {
	d, _ := framework.EnvelopeFromContext(ctx)
	return d.ID
}

// firstTime creates the marker file and reports whether it did not exist.
// Without a marker it always reports true.
func firstTime(marker string) bool {
	if marker == "" {
		return true
	}
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, os.ErrExist) {
		return false
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "notifications: crash marker: %v\n", err)
		os.Exit(3)
	}
	_ = f.Close()
	return true
}

// killSelf ends the process with SIGKILL: no deferred function, no
// rollback, no ack runs, as in a crash.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal ends the process before anything else runs
}
