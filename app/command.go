package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/spf13/cobra"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app/internal/cli"
	"github.com/effectively-once/effectively/app/internal/purge"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
)

// Command returns the service's command line, named name, with the
// subcommands serve, migrate, dead-letters (list, show, replay,
// discard, parked), events show, consumers and purge, and extra ones. opts are
// the service's fx options, as given to New.
//
// The commands are package app/internal/cli's; app gives them the
// service: how to serve it, migrate it, and build it for an operator's
// command (see openDatabase).
func Command(name string, opts fx.Option, extra ...*cobra.Command) *cobra.Command {
	opts = fx.Options(opts, fx.Supply(serviceName(name))) // named in the messages that say what to run
	return cli.Command(cli.Service{
		Name:    name,
		Serve:   func(ctx context.Context) error { return serve(ctx, opts) },
		Migrate: func(ctx context.Context, out io.Writer) error { return runMigrate(ctx, opts, out) },
		Open:    func() (cli.Database, func(), error) { return openDatabase(opts) },
	}, extra...)
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
	db, err := openDB(ctx, cfg.DatabaseURL, 0, false, "")
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

// operatorParams are what the operator's commands take from the
// service's options: the declarations of handlers.Register, which depend
// on nothing, and not the handlers.Registry, which builds every handler.
type operatorParams struct {
	fx.In

	Config       Config
	Store        driver.Store
	DB           *sqlx.DB
	Declarations []handlers.Declaration `group:"effectively.consumers"`
}

// openDatabase builds the service's application of opts for an
// operator's command (cli.Service.Open) and returns what the command
// works with, and the function that closes the database. The application
// is built, not started: its handlers, transport, router and start hooks
// do not run; the database must exist (existingDatabase), and the
// consumers' declarations are checked as the service checks them.
func openDatabase(opts fx.Option) (cli.Database, func(), error) {
	var (
		undo cleanup
		db   cli.Database
		tr   *operatorTransport
	)
	service := build(&undo,
		fx.Provide(ConfigFromEnv, newDB, newStore),
		fx.Supply(existingDatabase(true)),
		opts,
		fx.Invoke(func(p operatorParams) error {
			if err := handlers.CheckDeclarations(p.Declarations); err != nil {
				return err // what the service refuses at start
			}
			// The transport, opened by the commands that count what
			// waits in partitions, quietly: their errors say enough.
			tr = &operatorTransport{cfg: p.Config, db: p.DB, logger: slog.New(slog.DiscardHandler)}
			db = cli.Database{Config: operatorConfig(p.Config), Store: p.Store, Declarations: p.Declarations, Backlogs: tr.backlogs, Transport: tr.transport}
			return nil
		}),
	)
	if err := service.Err(); err != nil {
		return cli.Database{}, nil, explain(err)
	}
	return db, func() {
		_ = tr.Close() // best effort, as undo's hooks
		undo.run()
	}, nil
}

// operatorConfig is what the operator's commands and the console read of
// cfg.
func operatorConfig(cfg Config) cli.Config {
	return cli.Config{Transport: cfg.Transport, Settings: cfg.Settings, Retentions: retentions(cfg)}
}

// retentions are the purge's retentions of cfg.
func retentions(cfg Config) purge.Retentions {
	return purge.Retentions{
		Processed:   time.Duration(cfg.ProcessedRetention),
		Outbox:      time.Duration(cfg.OutboxRetention),
		Replays:     time.Duration(cfg.ReplayRetention),
		DeadLetters: time.Duration(cfg.DeadLetterRetention),
		Transport:   time.Duration(cfg.TransportRetention),
	}
}
