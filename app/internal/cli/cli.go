package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/effectively-once/effectively/app/internal/purge"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/middleware"
)

// Service is what the command line needs of the service. Package app
// fills it from the service's fx options: it builds the application, and
// the command line never sees fx.
type Service struct {
	// Name is the command's name (app.Command's name).
	Name string
	// Serve runs the service until ctx ends or the process receives
	// SIGINT or SIGTERM (the serve command).
	Serve func(ctx context.Context) error
	// Migrate applies the framework's migrations and the service's own,
	// and says so on out (the migrate command).
	Migrate func(ctx context.Context, out io.Writer) error
	// Open builds the service's application for an operator's command,
	// without starting it: no handler is built, no transport dialed. It
	// opens the service's database and returns what the commands work
	// with, and the function that closes the database. The declarations
	// are checked as the service checks them at start. Its errors read
	// as their cause alone (see app.Main).
	Open func() (Database, func(), error)
}

// Database is what an operator's command works with: the service's
// configuration, the store of its database and its declared consumers.
type Database struct {
	// Config is what the commands read of the service's configuration.
	Config Config
	// Store is the store of the service's database.
	Store driver.Store
	// Declarations are the consumers the service declares
	// (handlers.Register), which build no handler.
	Declarations []handlers.Declaration
	// Backlogs returns the service's transport as a counter of what
	// waits in a consumer's partitions, opening it on the first call
	// (the function that closes the database closes it too); nil, or a
	// nil counter, when the transport counts none.
	Backlogs func(ctx context.Context) (driver.BacklogCounter, error)
	// Transport returns the service's transport, opening it on the first
	// call (the function that closes the database closes it too); nil
	// when the command has none to open.
	Transport func(ctx context.Context) (driver.Transport, error)
}

// Config is what the commands read of the service's configuration.
type Config struct {
	// Transport is the transport's name, as EFFECTIVELY_TRANSPORT names
	// it (sqlite, postgres, amqp, memory).
	Transport string
	// Settings returns a consumer's settings, merged with the defaults.
	Settings func(consumer string) middleware.Settings
	// Retentions are the purge's; Retentions.Processed is
	// processed_retention, which a replay also respects.
	Retentions purge.Retentions
}

// The transports whose subscriptions the consumers view names: the
// values of app.TransportAMQP, app.TransportSQLite and
// app.TransportPostgres (TestConsumersView checks them).
const (
	transportAMQP     = "amqp"
	transportSQLite   = "sqlite"
	transportPostgres = "postgres"
)

// Command returns the service's command line, named s.Name, with the
// subcommands serve, migrate, dead-letters (list, show, replay, discard,
// parked), events show, consumers and purge, and extra ones.
func Command(s Service, extra ...*cobra.Command) *cobra.Command {
	root := &cobra.Command{
		Use:           s.Name,
		Short:         s.Name + ", a message-consumer service built on effectively",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		&cobra.Command{
			Use:   "serve",
			Short: "Consume messages until SIGINT or SIGTERM",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return s.Serve(cmd.Context())
			},
		},
		&cobra.Command{
			Use:   "migrate",
			Short: "Apply the framework's migrations and the service's own",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return s.Migrate(cmd.Context(), cmd.OutOrStdout())
			},
		},
		deadLettersCommand(s),
		eventsCommand(s),
		consumersCommand(s),
		purgeCommand(s),
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
	// cobra's own help command prints "Unknown help topic" and exits 0.
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || cmd == nil || len(rest) > 0 {
				return fmt.Errorf("unknown help topic %q (usage: %s)", strings.Join(args, " "), c.UseLine())
			}
			return cmd.Help()
		},
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
