package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/printable"
)

// removeGroupCommand returns the command that removes the consumer group
// of a consumer nobody runs any more from the transport's tables.
func removeGroupCommand(s Service) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "remove-group CONSUMER",
		Short: "Remove a consumer nobody runs any more from the postgres transport's consumer groups",
		Long: `Remove-group deletes CONSUMER's consumer group, and its partitions' groups
("CONSUMER#<p>/<n>"), from every offsets table of the postgres transport
(the tables named watermill_offsets_<type>, after the table prefix), in one
transaction, and prints each row it deleted: its table, its group and the
offset it had acknowledged. The purge deletes only the messages every group
of their topic passed, so a group nobody reads any more keeps every message
published since it stopped; once removed, it no longer does.

It refuses a consumer the service declares: its processes would write the
group again, from the first message. A name the service's consumers are
renamed from (handlers.RenamedFrom) is accepted. Stop every process that
still runs CONSUMER first (another service's, an older version's). With
--dry-run it prints what it would delete, and deletes nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return operate(cmd.Context(), s, func(ctx context.Context, op operator) error {
				return op.removeGroup(ctx, cmd.OutOrStdout(), args[0], dryRun)
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the groups it would remove, and remove nothing")
	return cmd
}

// removeGroup removes consumer's groups from the transport's tables,
// unless consumer is declared, and prints them on out.
func (op operator) removeGroup(ctx context.Context, out io.Writer, consumer string, dryRun bool) error {
	for _, name := range op.consumers {
		if name == consumer {
			return fmt.Errorf("remove-group: consumer %s is declared in this service: its processes would write its group again, from the first message (remove it from the service first)", printable.String(consumer))
		}
	}
	if op.cfg.Transport != transportPostgres || op.transport == nil {
		return fmt.Errorf("remove-group: the %s transport keeps no consumer groups that hold back a purge (only postgres does)", op.cfg.Transport)
	}
	tr, err := op.transport(ctx)
	if err != nil {
		return fmt.Errorf("remove-group %s: %w", printable.String(consumer), err)
	}
	gr, ok := tr.(driver.GroupRemover)
	if !ok {
		return fmt.Errorf("remove-group: the transport %T cannot remove consumer groups (driver.GroupRemover)", tr)
	}
	groups, err := gr.RemoveGroup(ctx, consumer, dryRun)
	if err != nil {
		return fmt.Errorf("remove-group %s: %w", printable.String(consumer), err)
	}
	if len(groups) == 0 {
		_, err := fmt.Fprintf(out, "no consumer group of %s in the transport's tables: nothing to do\n", printable.String(consumer))
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TABLE\tGROUP\tACKED OFFSET")
	for _, g := range groups {
		fmt.Fprintf(w, "%s\t%s\t%d\n", printable.String(g.Table), printable.String(g.Group), g.Offset)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("print: %w", err)
	}
	verb := "removed"
	if dryRun {
		verb = "would remove (dry run; nothing removed)"
	}
	_, err = fmt.Fprintf(out, "%s %d consumer group rows of %s\n", verb, len(groups), printable.String(consumer))
	return err
}
