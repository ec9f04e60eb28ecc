package app

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
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

// Command returns the service's command line, named name, with the
// subcommands serve, migrate, dead-letters (list, show, replay,
// discard, parked), events show, consumers and purge, and extra ones. opts are
// the service's fx options, as given to New.
func Command(name string, opts fx.Option, extra ...*cobra.Command) *cobra.Command {
	opts = fx.Options(opts, fx.Supply(serviceName(name))) // named in the messages that say what to run
	root := &cobra.Command{
		Use:           name,
		Short:         name + ", a message-consumer service built on effectively",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		&cobra.Command{
			Use:   "serve",
			Short: "Consume messages until SIGINT or SIGTERM",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return serve(cmd.Context(), opts)
			},
		},
		&cobra.Command{
			Use:   "migrate",
			Short: "Apply the framework's migrations and the service's own",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return runMigrate(cmd.Context(), opts, cmd.OutOrStdout())
			},
		},
		deadLettersCommand(opts),
		eventsCommand(opts),
		consumersCommand(opts),
		purgeCommand(opts),
	)
	root.AddCommand(extra...)
	usageErrors(root)
	return root
}

// usageErrors makes root's commands say what they take when used wrongly.
// A command of subcommands alone (dead-letters, events) refuses an
// unknown one as root does, instead of printing its help and exiting 0:
// a mistyped subcommand in a script went unnoticed. A wrong number of
// arguments, or a bad flag, is an error that ends with the command's
// usage line ("accepts 1 arg(s), received 0" did not say which).
func usageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (usage: %s)", err, cmd.UseLine())
	})
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
		switch {
		case !cmd.HasParent():
			// cobra refuses an unknown command of the root itself.
		case !cmd.Runnable() && cmd.HasSubCommands():
			cmd.Args = unknownSubcommand
			cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		case cmd.Args != nil:
			args := cmd.Args
			cmd.Args = func(cmd *cobra.Command, a []string) error {
				if err := args(cmd, a); err != nil {
					return fmt.Errorf("%w (usage: %s)", err, cmd.UseLine())
				}
				return nil
			}
		}
	}
	walk(root)
}

// unknownSubcommand refuses the arguments of a command of subcommands
// alone: the first names none of them.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	cmd.SuggestionsMinimumDistance = cmp.Or(cmd.SuggestionsMinimumDistance, 2) // as cobra's root
	if suggestions := cmd.SuggestionsFor(args[0]); len(suggestions) > 0 {
		msg += ": did you mean " + strings.Join(suggestions, " or ") + "?"
	}
	return fmt.Errorf("%s (usage: %s [command])", msg, cmd.CommandPath())
}

// Main runs Command with the process's arguments and exits with 1 when it
// fails, printing the error to stderr as one line: its cause, which names
// the fix (a duplicate consumer name, a bad setting, a broker that refused
// the credentials), without fx's chain of constructors or file paths.
func Main(name string, opts fx.Option, extra ...*cobra.Command) {
	os.Exit(execute(context.Background(), Command(name, opts, extra...), os.Stderr))
}

// execute runs cmd and returns the process's exit code: 0, or 1 after
// printing the error to stderr as one line.
func execute(ctx context.Context, cmd *cobra.Command, stderr io.Writer) int {
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", cmd.Name(), oneLine(explain(err).Error()))
		return 1
	}
	return 0
}

func runMigrate(ctx context.Context, opts fx.Option, out io.Writer) error {
	var (
		cfg Config
		m   Migrations
	)
	app := fx.New(opts, fx.Provide(ConfigFromEnv), fx.NopLogger, fx.Populate(&cfg), fx.Invoke(func(p struct {
		fx.In
		Migrations Migrations `optional:"true"`
	},
	) {
		m = p.Migrations
	}))
	if err := app.Err(); err != nil {
		return explain(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	db, err := openDB(ctx, cfg.DatabaseURL, 0, false)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer db.Close()
	if err := migrateUp(ctx, db, cfg, m); err != nil {
		return err
	}
	fmt.Fprintln(out, "migrations applied")
	return nil
}
