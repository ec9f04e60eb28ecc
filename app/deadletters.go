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
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
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
				if err := printDeadLetter(cmd.OutOrStdout(), dl); err != nil {
					return err
				}
				return op.reportParked(ctx, cmd.OutOrStdout(), dl, "listed by dead-letters parked --subject "+dl.Subject)
			})
		},
	}

	var (
		by, reason   string
		releaseAfter bool
	)
	replay := &cobra.Command{
		Use:   "replay ID...",
		Short: "Send pending dead letters again to their consumer alone, and mark them replayed",
		Long: `Replay publishes each pending dead letter's original message again, to its
consumer alone (other consumers of the event type do not see it again), then
marks it replayed. The event was never marked processed, so the consumer
handles it afresh; should it fail again, the dead letter is pending again and
counts the repeat. A replay cut short between the publish and the mark sends
the message again next time: the consumer's deduplication absorbs it.

Under strict_order, the later events of the dead letter's subject are parked
behind it (see the parked command): once the replayed event takes effect,
the consumer applies them after it, in order.

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
					dl, err := op.replay(ctx, rp, id, framework.Resolution{Status: framework.DeadLetterReplayed, By: by, Reason: reason})
					if err != nil {
						return err
					}
					fmt.Fprintf(cmd.OutOrStdout(), "dead letter %d replayed\n", id)
					if err := op.reportParked(ctx, cmd.OutOrStdout(), dl, "they are applied after it, in order, once it takes effect"); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	discard := &cobra.Command{
		Use:   "discard ID...",
		Short: "Mark pending dead letters discarded: never to be processed",
		Long: `Discard marks each pending dead letter discarded: it will never be processed.

Under strict_order, the later events of the dead letter's subject are parked
behind it and stay parked after a discard, until the operator asks for them:
with --release-parked the subject's sequence skips the discarded event, and
its parked events are handed to the consumer (through its replay path) to be
applied in order. --release-parked also works on a dead letter discarded
before; running it again hands the parked events over again, which the
consumer absorbs.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			if reason == "" {
				return errors.New("--reason: say why the messages will never be processed")
			}
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				var rp *replayer
				if releaseAfter {
					var err error
					if rp, err = openReplayer(ctx, op.cfg, op.db); err != nil {
						return err
					}
					defer rp.Close()
				}
				for _, id := range ids {
					r := framework.Resolution{Status: framework.DeadLetterDiscarded, By: by, Reason: reason}
					if err := op.discard(ctx, cmd.OutOrStdout(), rp, id, r); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	discard.Flags().BoolVar(&releaseAfter, "release-parked", false,
		"skip the discarded event in its subject's sequence and apply the events parked behind it (strict_order)")
	for _, c := range []*cobra.Command{replay, discard} {
		c.Flags().StringVar(&by, "by", os.Getenv("USER"), "who does it (recorded)")
		c.Flags().StringVar(&reason, "reason", "", "why (recorded; required)")
	}
	root.AddCommand(list, show, replay, discard, parkedCommand(opts))
	return root
}

// parkedCommand returns the command that lists the events parked behind
// dead letters, per subject.
func parkedCommand(opts fx.Option) *cobra.Command {
	var filter framework.ParkedFilter
	cmd := &cobra.Command{
		Use:   "parked",
		Short: "List, per subject, the events parked behind a dead letter (strict_order)",
		Long: `Under strict_order, while an event of a subject is a dead letter, the later
events of that subject are parked behind it: acknowledged, not processed.
Parked lists them per consumer and subject: the sequence and event of the
dead letter they wait behind (HELD), and their sequences. Replaying the dead
letter applies them after it; discarding it with --release-parked applies
them without it. READY counts parked events whose turn has come: the
consumer applies them at its next message.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				ps, err := op.deadLetters.Parked(ctx, filter)
				if err != nil {
					return err
				}
				return printParked(cmd.OutOrStdout(), ps)
			})
		},
	}
	cmd.Flags().StringVar(&filter.Consumer, "consumer", "", "only this consumer's")
	cmd.Flags().StringVar(&filter.Subject, "subject", "", "only this subject's")
	return cmd
}

// replay publishes the dead letter id to its consumer alone through rp,
// then marks it resolved with r, and returns it.
func (op operator) replay(ctx context.Context, rp *replayer, id int64, r framework.Resolution) (framework.DeadLetter, error) {
	dl, err := op.deadLetters.DeadLetter(ctx, id)
	if err != nil {
		return dl, fmt.Errorf("dead letter %d: %w", id, err)
	}
	if dl.Status != framework.DeadLetterPending {
		return dl, fmt.Errorf("dead letter %d is %s, not pending", id, dl.Status)
	}
	if !slices.Contains(op.consumers, dl.Consumer) {
		return dl, fmt.Errorf("dead letter %d: consumer %s is not declared in this service, so nothing would consume the replay", id, dl.Consumer)
	}
	if err := rp.Replay(ctx, dl.Consumer, dl.ReplayMessage()); err != nil {
		return dl, fmt.Errorf("replay dead letter %d: %w", id, err)
	}
	if _, err := op.deadLetters.ResolveDeadLetter(ctx, id, r); err != nil {
		return dl, fmt.Errorf("mark dead letter %d replayed: %w", id, err)
	}
	return dl, nil
}

// discard marks the dead letter id discarded with r, and tells out what
// becomes of the events parked behind it: they stay parked unless rp is
// set (--release-parked), which skips the dead letter in its subject's
// sequence and hands the parked events whose turn came to the consumer
// through rp. With rp, a dead letter discarded before is accepted.
func (op operator) discard(ctx context.Context, out io.Writer, rp *replayer, id int64, r framework.Resolution) error {
	dl, err := op.deadLetters.DeadLetter(ctx, id)
	if err != nil {
		return fmt.Errorf("dead letter %d: %w", id, err)
	}
	if rp == nil || dl.Status != framework.DeadLetterDiscarded {
		if _, err := op.deadLetters.ResolveDeadLetter(ctx, id, r); err != nil {
			return fmt.Errorf("discard dead letter %d: %w", id, err)
		}
	}
	fmt.Fprintf(out, "dead letter %d discarded\n", id)
	if rp == nil {
		return op.reportParked(ctx, out, dl, "they stay parked: discard it again with --release-parked to apply them")
	}
	if dl.Subject == "" {
		return nil
	}
	if !slices.Contains(op.consumers, dl.Consumer) {
		return fmt.Errorf("dead letter %d: consumer %s is not declared in this service, so nothing would apply its parked events", id, dl.Consumer)
	}
	parked, err := op.parkedBehind(ctx, dl)
	if err != nil {
		return err
	}
	if _, err := op.deadLetters.Skip(ctx, dl.Consumer, dl.Subject, dl.Key()); err != nil && !errors.Is(err, framework.ErrNotFound) {
		return fmt.Errorf("dead letter %d: skip it in the sequence of %s: %w", id, dl.Subject, err)
	} // not found: skipped before, or nothing was held behind it
	ready, err := op.deadLetters.Parked(ctx, framework.ParkedFilter{Consumer: dl.Consumer, Subject: dl.Subject, Ready: true})
	if err != nil {
		return err
	}
	for _, p := range ready {
		if err := rp.Replay(ctx, dl.Consumer, parkedMessage(p)); err != nil {
			return fmt.Errorf("dead letter %d: release the events parked behind it: %w", id, err)
		}
	}
	fmt.Fprintf(out, "%d events of subject %s parked behind it are released to %s, to be applied in order\n", len(parked), dl.Subject, dl.Consumer)
	return nil
}

// parkedBehind returns the events of dl's subject parked for its
// consumer (not the dead letters they wait behind).
func (op operator) parkedBehind(ctx context.Context, dl framework.DeadLetter) ([]framework.ParkedEvent, error) {
	if dl.Subject == "" {
		return nil, nil
	}
	ps, err := op.deadLetters.Parked(ctx, framework.ParkedFilter{Consumer: dl.Consumer, Subject: dl.Subject})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(ps, func(p framework.ParkedEvent) bool { return p.Held }), nil
}

// reportParked tells out how many events are parked behind dl, and what
// becomes of them, when there are any.
func (op operator) reportParked(ctx context.Context, out io.Writer, dl framework.DeadLetter, fate string) error {
	parked, err := op.parkedBehind(ctx, dl)
	if err != nil || len(parked) == 0 {
		return err
	}
	_, err = fmt.Fprintf(out, "%d events of subject %s are parked behind it: %s\n", len(parked), dl.Subject, fate)
	return err
}

// parkedMessage is the message of the parked event p, handed to its
// consumer again: its body and metadata, without the transport's
// redelivery marker.
func parkedMessage(p framework.ParkedEvent) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), p.Body)
	for k, v := range p.Metadata {
		if k != framework.MetadataRedelivered {
			msg.Metadata.Set(k, v)
		}
	}
	return msg
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

// printParked prints ps per consumer and subject: the dead letter they
// wait behind, their sequences, how many, and how many are ready.
func printParked(out io.Writer, ps []framework.ParkedEvent) error {
	type row struct {
		consumer, subject, held string
		seqs                    []string
		ready                   int
	}
	var rows []*row
	for _, p := range ps {
		if len(rows) == 0 || rows[len(rows)-1].consumer != p.Consumer || rows[len(rows)-1].subject != p.Subject {
			rows = append(rows, &row{consumer: p.Consumer, subject: p.Subject})
		}
		r := rows[len(rows)-1]
		switch {
		case p.Held:
			if r.held != "" {
				r.held += ", "
			}
			r.held += fmt.Sprintf("#%d %s", p.Seq, p.Key)
		default:
			r.seqs = append(r.seqs, strconv.FormatInt(p.Seq, 10))
			if p.Ready {
				r.ready++
			}
		}
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONSUMER\tSUBJECT\tHELD\tPARKED\tCOUNT\tREADY")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\n", r.consumer, r.subject, orDash(r.held),
			orDash(strings.Join(r.seqs, " ")), len(r.seqs), r.ready)
	}
	return w.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
