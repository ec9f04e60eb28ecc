package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/effectively-once/effectively/app/internal/purge"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/printable"
)

// purgeCommand returns the purge command: one purge now, or with
// --dry-run what it would delete.
func purgeCommand(s Service) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete what is past its retention, once (the service does it every purge_interval)",
		Long: `Delete, in batches, the delivery counts of messages that finished, the
processed marks older than processed_retention, the outbox rows sent longer
ago than outbox_retention, the replays sent longer ago than
replay_retention, and the dead letters replayed or discarded longer ago than
dead_letter_retention with their history (pending ones never), and on the
postgres transport the messages of the consumers' topics that every consumer
group of the topic passed, written longer ago than transport_retention. One process
of the service purges at a time: while another does, the command exits 1.
With --dry-run it prints what it would delete, and deletes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return operate(cmd.Context(), s, func(ctx context.Context, op operator) error {
				// The runner's purge, once (see runner.Config.PurgeInterval).
				pu := purge.New(op.deadLetters, op.cfg.Retentions, slog.New(slog.DiscardHandler))
				tp, err := op.topicPurger(ctx)
				if err != nil {
					return err
				}
				if tp != nil {
					pu.WithTopics(tp, op.topics)
				}
				run, verb := pu.Purge, "deleted"
				if dryRun {
					run, verb = pu.DryRun, "would delete"
				}
				steps, err := run(ctx)
				if perr := printPurge(cmd.OutOrStdout(), steps, verb); err == nil {
					err = perr
				}
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what the purge would delete, and delete nothing")
	return cmd
}

// purgeWhat says what each kind of purge deletes, for the command's
// table.
var purgeWhat = map[driver.PurgeKind]string{
	driver.PurgeDeliveries:  "delivery counts of finished messages",
	driver.PurgeProcessed:   "processed marks",
	driver.PurgeOutbox:      "sent outbox rows",
	driver.PurgeReplays:     "sent replays",
	driver.PurgeDeadLetters: "resolved dead letters",
	purge.KindTransport:     "transport messages of",
}

// printPurge prints a row per step: what, older than when, how many.
func printPurge(out io.Writer, steps []purge.Step, verb string) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "WHAT\tOLDER THAN\t%s\n", verb)
	for _, s := range steps {
		before := "(finished)"
		if !s.Before.IsZero() {
			before = s.Before.UTC().Format(time.RFC3339)
			if s.Kind == driver.PurgeDeliveries {
				before += " or finished"
			}
		}
		what := purgeWhat[s.Kind]
		if s.Topic != "" {
			what += " " + printable.String(s.Topic)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\n", what, before, s.Rows)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("print: %w", err)
	}
	return nil
}
