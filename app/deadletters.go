package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/spf13/cobra"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

// operator is what the dead-letter commands work with: the configuration,
// the database's store and the names of the declared consumers. It builds
// no handler, so nothing a handler's constructor needs or dials; list, show
// and discard use the database alone, and replay opens the transport's
// replay path (openReplayer).
type operator struct {
	cfg         Config
	db          *sqlx.DB
	deadLetters framework.Store
	consumers   []string
}

// operatorParams are what the operator takes from the service's options:
// the declarations of handlers.Register, which depend on nothing, and not
// the handlers.Registry, which builds every handler.
type operatorParams struct {
	fx.In

	Config       Config
	DB           *sqlx.DB
	Store        framework.Store
	Declarations []handlers.Declaration `group:"effectively.consumers"`
}

// operate opens the service's database, runs fn and closes it. The
// service's application is built, not started: its handlers, transport,
// router and start hooks do not run.
func operate(ctx context.Context, opts fx.Option, fn func(ctx context.Context, op operator) error) error {
	var (
		undo cleanup
		op   operator
	)
	service := build(&undo,
		fx.Provide(ConfigFromEnv, newDB, newStore),
		opts,
		fx.Invoke(func(p operatorParams) {
			op = operator{cfg: p.Config, db: p.DB, deadLetters: p.Store}
			for _, d := range p.Declarations {
				op.consumers = append(op.consumers, d.Name)
			}
		}),
	)
	if err := service.Err(); err != nil {
		return explain(err)
	}
	defer undo.run() // closes the database
	return fn(ctx, op)
}

// deadLettersCommand returns the operator's commands on dead letters.
func deadLettersCommand(opts fx.Option) *cobra.Command {
	root := &cobra.Command{
		Use:     "dead-letters",
		Aliases: []string{"dl"},
		Short:   "Inspect, replay and discard the messages consumers gave up on",
	}

	var (
		filter    framework.DeadLetterFilter
		status    string
		codeFlag  string
		showLimit int
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch status {
			case "all":
				filter.Status = ""
			case string(framework.DeadLetterPending), string(framework.DeadLetterReplayed), string(framework.DeadLetterDiscarded):
				filter.Status = framework.DeadLetterStatus(status)
			default:
				return fmt.Errorf("--status: want pending, replayed, discarded or all, got %q", status)
			}
			filter.Code = framework.Code(codeFlag)
			filter.Limit = showLimit
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				dls, err := op.deadLetters.DeadLetters(ctx, filter)
				if err != nil {
					return err
				}
				return printList(cmd.OutOrStdout(), dls)
			})
		},
	}
	list.Flags().StringVar(&filter.Consumer, "consumer", "", "only this consumer's")
	list.Flags().StringVar(&codeFlag, "code", "", "only those with this code")
	list.Flags().StringVar(&status, "status", string(framework.DeadLetterPending), "pending, replayed, discarded or all")
	list.Flags().Int64Var(&filter.AfterID, "after", 0, "only those with a greater id (paging)")
	list.Flags().IntVar(&showLimit, "limit", 100, "at most this many")

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter with its original message",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				dl, err := op.deadLetters.DeadLetter(ctx, id)
				if err != nil {
					return fmt.Errorf("dead letter %d: %w", id, err)
				}
				return printDeadLetter(cmd.OutOrStdout(), dl)
			})
		},
	}

	var by, reason string
	replay := &cobra.Command{
		Use:   "replay ID...",
		Short: "Send pending dead letters again to their consumer alone, and mark them replayed",
		Long: `Replay publishes each pending dead letter's original message again, to its
consumer alone (other consumers of the event type do not see it again), then
marks it replayed. The event was never marked processed, so the consumer
handles it afresh; should it fail again, the dead letter is pending again and
counts the repeat. A replay cut short between the publish and the mark sends
the message again next time: the consumer's deduplication absorbs it.

--reason is required. On amqp the replay waits a few seconds at most for the
broker (EFFECTIVELY_AMQP_URL); list, show and discard need only the database.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			if reason == "" {
				return errors.New("--reason: say why the messages can be processed now")
			}
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				rp, err := openReplayer(ctx, op.cfg, op.db)
				if err != nil {
					return err
				}
				defer rp.Close()
				for _, id := range ids {
					if err := op.replay(ctx, rp, id, framework.Resolution{Status: framework.DeadLetterReplayed, By: by, Reason: reason}); err != nil {
						return err
					}
					fmt.Fprintf(cmd.OutOrStdout(), "dead letter %d replayed\n", id)
				}
				return nil
			})
		},
	}
	discard := &cobra.Command{
		Use:   "discard ID...",
		Short: "Mark pending dead letters discarded: never to be processed",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			if reason == "" {
				return errors.New("--reason: say why the messages will never be processed")
			}
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				for _, id := range ids {
					r := framework.Resolution{Status: framework.DeadLetterDiscarded, By: by, Reason: reason}
					if err := op.deadLetters.ResolveDeadLetter(ctx, id, r); err != nil {
						return fmt.Errorf("discard dead letter %d: %w", id, err)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "dead letter %d discarded\n", id)
				}
				return nil
			})
		},
	}
	for _, c := range []*cobra.Command{replay, discard} {
		c.Flags().StringVar(&by, "by", os.Getenv("USER"), "who does it (recorded)")
		c.Flags().StringVar(&reason, "reason", "", "why (recorded; required)")
	}
	root.AddCommand(list, show, replay, discard)
	return root
}

// replay publishes the dead letter id to its consumer alone through rp,
// then marks it resolved with r.
func (op operator) replay(ctx context.Context, rp *replayer, id int64, r framework.Resolution) error {
	dl, err := op.deadLetters.DeadLetter(ctx, id)
	if err != nil {
		return fmt.Errorf("dead letter %d: %w", id, err)
	}
	if dl.Status != framework.DeadLetterPending {
		return fmt.Errorf("dead letter %d is %s, not pending", id, dl.Status)
	}
	if !slices.Contains(op.consumers, dl.Consumer) {
		return fmt.Errorf("dead letter %d: consumer %s is not declared in this service, so nothing would consume the replay", id, dl.Consumer)
	}
	if err := rp.Replay(ctx, dl.Consumer, dl.ReplayMessage()); err != nil {
		return fmt.Errorf("replay dead letter %d: %w", id, err)
	}
	if err := op.deadLetters.ResolveDeadLetter(ctx, id, r); err != nil {
		return fmt.Errorf("mark dead letter %d replayed: %w", id, err)
	}
	return nil
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("dead letter id %q: want a positive integer", s)
	}
	return id, nil
}

func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := parseID(a)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func printList(out io.Writer, dls []framework.DeadLetter) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tCONSUMER\tCODE\tTYPE\tVERSION\tSOURCE\tEVENT\tATTEMPTS\tREPEATS\tLAST FAILED\tSTATUS")
	for _, dl := range dls {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\n",
			dl.ID, dl.Consumer, dl.Code, orDash(dl.Type), dl.Version, orDash(dl.Source), dl.EventID,
			dl.Attempts, dl.Repeats, dl.LastFailedAt.UTC().Format(time.RFC3339), dl.Status)
	}
	return w.Flush()
}

func printDeadLetter(out io.Writer, dl framework.DeadLetter) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(w, "%s\t%v\n", k, v) }
	row("id", dl.ID)
	row("consumer", dl.Consumer)
	row("topic", dl.Topic)
	row("code", dl.Code)
	row("status", dl.Status)
	if dl.Status != framework.DeadLetterPending {
		row("resolved", fmt.Sprintf("%s by %s at %s: %s", dl.Resolution.Status, dl.Resolution.By, dl.Resolution.At.UTC().Format(time.RFC3339), dl.Resolution.Reason))
	}
	row("source", orDash(dl.Source))
	row("event id", dl.EventID)
	row("type", fmt.Sprintf("%s v%d", orDash(dl.Type), dl.Version))
	row("subject", orDash(dl.Subject))
	row("correlation id", orDash(dl.CorrelationID))
	row("attempts", dl.Attempts)
	row("repeats", dl.Repeats)
	row("first failed", dl.FirstFailedAt.UTC().Format(time.RFC3339Nano))
	row("last failed", dl.LastFailedAt.UTC().Format(time.RFC3339Nano))
	keys := make([]string, 0, len(dl.Metadata))
	for k := range dl.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		row("metadata "+k, dl.Metadata[k])
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "body:")
	var pretty any
	if json.Unmarshal(dl.Body, &pretty) == nil {
		b, err := json.MarshalIndent(pretty, "  ", "  ")
		if err == nil {
			_, err = fmt.Fprintf(out, "  %s\n", b)
		}
		return err
	}
	_, err := fmt.Fprintf(out, "  %q\n", dl.Body)
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
