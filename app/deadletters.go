package app

import (
	"bytes"
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

	"github.com/jmoiron/sqlx"
	"github.com/spf13/cobra"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
)

// operator is what the dead-letter commands work with: the configuration,
// the database's store and the names of the declared consumers. It builds
// no handler, so nothing a handler's constructor needs or dials, and uses
// the database alone: a replay is recorded there, and the running service
// publishes it (the runner's replay relay, see app/runner).
type operator struct {
	cfg         Config
	db          *sqlx.DB
	deadLetters driver.Store
	consumers   []string
	known       map[string]bool // the declared names and those they are renamed from
}

// noteUndeclared tells w when the consumer a command filters by is not
// declared (nor renamed from) in this service: a typo there selects
// nothing, silently. It is a note, not an error: the database may hold
// what a consumer removed since left behind.
func (op operator) noteUndeclared(w io.Writer, consumer string) {
	if consumer == "" || op.known[consumer] {
		return
	}
	declared := strings.Join(op.consumers, ", ")
	if declared == "" {
		declared = "none"
	}
	fmt.Fprintf(w, "note: no consumer named %s is declared in this service (declared: %s)\n", printable(consumer), declared)
}

// operatorParams are what the operator takes from the service's options:
// the declarations of handlers.Register, which depend on nothing, and not
// the handlers.Registry, which builds every handler.
type operatorParams struct {
	fx.In

	Config       Config
	DB           *sqlx.DB
	Store        driver.Store
	Declarations []handlers.Declaration `group:"effectively.consumers"`
}

// operate opens the service's database, runs fn and closes it. The
// service's application is built, not started: its handlers, transport,
// router and start hooks do not run; the consumers' declarations are
// checked as the service checks them.
func operate(ctx context.Context, opts fx.Option, fn func(ctx context.Context, op operator) error) error {
	var (
		undo cleanup
		op   operator
	)
	service := build(&undo,
		fx.Provide(ConfigFromEnv, newDB, newStore),
		fx.Supply(existingDatabase(true)),
		opts,
		fx.Invoke(func(p operatorParams) error {
			if err := handlers.CheckDeclarations(p.Declarations); err != nil {
				return err // what the service refuses at start
			}
			op = operator{cfg: p.Config, db: p.DB, deadLetters: p.Store, known: make(map[string]bool)}
			for _, d := range p.Declarations {
				op.consumers = append(op.consumers, d.Name)
				op.known[d.Name] = true
				for _, old := range d.RenamedFrom {
					op.known[old] = true
				}
			}
			slices.Sort(op.consumers)
			return nil
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
		filter    driver.DeadLetterFilter
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
			case string(driver.DeadLetterPending), string(driver.DeadLetterReplayed), string(driver.DeadLetterDiscarded):
				filter.Status = driver.DeadLetterStatus(status)
			default:
				return fmt.Errorf("--status: want pending, replayed, discarded or all, got %q", status)
			}
			switch {
			case showLimit < 1:
				return fmt.Errorf("--limit: want 1 or more, got %d", showLimit)
			case filter.AfterID < 0:
				return fmt.Errorf("--after: want an id, 0 or more, got %d", filter.AfterID)
			}
			filter.Code = framework.Code(codeFlag)
			filter.Limit = showLimit
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				op.noteUndeclared(cmd.ErrOrStderr(), filter.Consumer)
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
	list.Flags().StringVar(&status, "status", string(driver.DeadLetterPending), "pending, replayed, discarded or all")
	list.Flags().Int64Var(&filter.AfterID, "after", 0, "only those with a greater id (paging)")
	list.Flags().IntVar(&showLimit, "limit", 100, "at most this many")

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter with its original message and its history",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				dl, err := op.deadLetters.DeadLetter(ctx, id)
				if errors.Is(err, driver.ErrNotFound) {
					return fmt.Errorf("dead letter %d: %w", id, driver.ErrNotFound)
				}
				if err != nil {
					return err // the store's error names the dead letter
				}
				if err := printDeadLetter(cmd.OutOrStdout(), dl); err != nil {
					return err
				}
				history, err := op.deadLetters.DeadLetterHistory(ctx, id)
				if err != nil {
					return fmt.Errorf("dead letter %d: history: %w", id, err)
				}
				if err := printHistory(cmd.OutOrStdout(), history); err != nil {
					return err
				}
				return op.reportParked(ctx, cmd.OutOrStdout(), dl, "listed by dead-letters parked --subject "+dl.Subject)
			})
		},
	}

	root.AddCommand(list, show, replayCommand(opts), discardCommand(opts), parkedCommand(opts))
	return root
}

// resolutionFlags adds the flags that say who resolves dead letters and
// why, both recorded in their history.
func resolutionFlags(cmd *cobra.Command, r *driver.Resolution) {
	cmd.Flags().StringVar(&r.By, "by", os.Getenv("USER"), "who does it (recorded; defaults to $USER)")
	cmd.Flags().StringVar(&r.Reason, "reason", "", "why (recorded; required)")
}

// checkResolution refuses a resolution without an actor or a reason, or
// with one that no store can record (driver.Resolution.Validate); why
// says what the reason should say.
func checkResolution(r driver.Resolution, why string) error {
	switch {
	case strings.TrimSpace(r.Reason) == "":
		return fmt.Errorf("--reason: say %s", why)
	case strings.TrimSpace(r.By) == "":
		return errors.New("--by: say who you are: it is empty (give it, or set $USER, its default)")
	}
	if err := r.Validate(); err != nil {
		if fe, ok := errors.AsType[*framework.FieldError](err); ok {
			return fmt.Errorf("--%s: %s", fe.Field, fe.Reason)
		}
		return err
	}
	return nil
}

// minRate is the slowest --rate a replay takes: one an hour. A slower one
// waited longer than anyone runs a command between two replays (1e-9 is
// one every 31 years).
const minRate = 1.0 / 3600

// replayCommand returns the command that replays dead letters, named or
// selected by a filter.
func replayCommand(opts fx.Option) *cobra.Command {
	var (
		req          replayRequest
		codeFlag     string
		since, until string
		perSecond    float64
	)
	cmd := &cobra.Command{
		Use:   "replay [ID...]",
		Short: "Send pending dead letters again to their consumer alone: the named ones, or those a filter selects",
		Long: `Replay records, for each pending dead letter, in one transaction, that it is
replayed (who, when, why: kept in its history) and its original message to
hand again to its consumer alone (other consumers of the event type do not
see it again). The running service publishes the recorded replays (within
a second); until a service runs, they wait in the database. The command
needs only the database. The event was never marked processed, so the
consumer handles it afresh; should it fail again, the dead letter is
pending again, with the new failure in its history. Of two operators who
replay the same dead letter at once, one replays it and the other is
refused: it is published once.

Name the dead letters by id, or select the pending ones by filter
(--consumer, --code, --type, --subject, --since, --until: their first
failure at or after --since, before --until). A replay goes per subject in
the order of the subject's sequence (numerically), then of first failure.
Each dead letter is reported: replayed, or refused and why (not found; not
pending: who resolved it, when; its consumer is not declared in this
service; it first failed longer ago than processed_retention, so that a
duplicate could no longer be detected: --force replays it anyway). The
command goes on after a refusal and exits non-zero when it refused any.
--dry-run lists what would be replayed and what would be refused,
records nothing, and exits non-zero when the replay would refuse any.
--rate N records at most N replays a second. On a terminal a progress
bar shows on stderr.

Under strict_order, the later events of the dead letter's subject are parked
behind it (see the parked command): once the replayed event takes effect,
the consumer applies them after it, in order.

--reason and --by (default $USER) are required, except for a dry run.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.ids, err = parseIDs(args); err != nil {
				return err
			}
			req.filter.Code = framework.Code(codeFlag)
			if req.filter.FailedSince, err = parseTime("since", since); err != nil {
				return err
			}
			if req.filter.FailedBefore, err = parseTime("until", until); err != nil {
				return err
			}
			if since != "" && until != "" && !req.filter.FailedBefore.After(req.filter.FailedSince) {
				return errors.New("--until: want a time after --since: nothing first failed between them")
			}
			byFilter := req.filter != (driver.DeadLetterFilter{})
			switch {
			case len(req.ids) > 0 && byFilter:
				return errors.New("replay: name dead letters by id or select them by filter, not both")
			case len(req.ids) == 0 && !byFilter:
				return errors.New("replay: name dead letters by id, or select them with --consumer, --code, --type, --subject, --since or --until")
			case !(perSecond >= 0): // NaN too
				return fmt.Errorf("--rate: want a positive number of replays a second (0: no limit), got %v", perSecond)
			case perSecond > 0 && perSecond < minRate:
				return fmt.Errorf("--rate: want at least %v replays a second (one an hour; 0: no limit), got %v: the command would wait between two replays for longer", minRate, perSecond)
			}
			req.resolution.Status = driver.DeadLetterReplayed
			if !req.dryRun {
				if err := checkResolution(req.resolution, "why the messages can be processed now"); err != nil {
					return err
				}
			}
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				op.noteUndeclared(cmd.ErrOrStderr(), req.filter.Consumer)
				return op.replay(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), req, newThrottle(perSecond))
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.filter.Consumer, "consumer", "", "those of this consumer")
	f.StringVar(&codeFlag, "code", "", "those with this code")
	f.StringVar(&req.filter.Type, "type", "", "those of this event type")
	f.StringVar(&req.filter.Subject, "subject", "", "those of this subject")
	f.StringVar(&since, "since", "", "those that first failed at or after this time (RFC 3339 or a date)")
	f.StringVar(&until, "until", "", "those that first failed before this time (RFC 3339 or a date)")
	f.Float64Var(&perSecond, "rate", 0, "at most this many replays a second (0: no limit)")
	f.BoolVar(&req.dryRun, "dry-run", false, "list what would be replayed and what would be refused; record nothing")
	f.BoolVar(&req.force, "force", false, "replay dead letters that first failed longer ago than processed_retention too")
	resolutionFlags(cmd, &req.resolution)
	return cmd
}

// replay replays what req selects (see replayCommand), printing per dead
// letter what it did to out and a progress bar to errOut when it is a
// terminal.
func (op operator) replay(ctx context.Context, out, errOut io.Writer, req replayRequest, th *throttle) error {
	vs, errs, err := op.selectReplays(ctx, req, time.Now())
	if err != nil {
		return err
	}
	todo := 0
	for _, v := range vs {
		if v.refused == "" {
			todo++
		}
	}
	if req.dryRun {
		for _, v := range vs {
			fmt.Fprintln(out, v.dryLine())
		}
		if _, err := fmt.Fprintf(out, "dry run: %d would be replayed, %d refused; nothing recorded\n", todo, len(vs)-todo); err != nil {
			return err
		}
		var refused *refusedError
		if errors.As(refusals(vs, errs), &refused) {
			return &dryRunError{refused}
		}
		return nil
	}
	more, err := op.replayAll(ctx, out, vs, req.resolution, th, newProgress(errOut, todo))
	errs = append(errs, more...)
	if err != nil {
		return err
	}
	replayed := 0
	for _, v := range vs {
		if v.refused == "" {
			replayed++
		}
	}
	if replayed > 0 {
		fmt.Fprintf(out, "%d replayed, %d refused: the running service publishes the replays to their consumers\n", replayed, len(vs)-replayed)
	} else if len(vs) == 0 {
		fmt.Fprintln(out, "no pending dead letter matches")
	}
	return refusals(vs, errs)
}

// discardCommand returns the command that discards dead letters.
func discardCommand(opts fx.Option) *cobra.Command {
	var (
		r            driver.Resolution
		releaseAfter bool
	)
	cmd := &cobra.Command{
		Use:   "discard ID...",
		Short: "Mark pending dead letters discarded: never to be processed",
		Long: `Discard marks each pending dead letter discarded: it will never be processed.
Who, when and why are kept in its history. Each dead letter is reported:
discarded, or refused and why (not found; not pending: who resolved it,
when); the command goes on after a refusal and exits non-zero when it
refused any. --reason and --by (default $USER) are required.

Under strict_order, the later events of the dead letter's subject are parked
behind it and stay parked after a discard, until the operator asks for them:
with --release-parked the subject's sequence skips the discarded event, and
its parked events are recorded to hand to the consumer (through its replay
path; the running service publishes them) to be applied in order.
--release-parked also works on a dead letter discarded before; running it
again hands the parked events over again, which the consumer absorbs.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			r.Status = driver.DeadLetterDiscarded
			if err := checkResolution(r, "why the messages will never be processed"); err != nil {
				return err
			}
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				vs := make([]verdict, 0, len(ids))
				var errs []error
				for _, id := range ids {
					v, err := op.discard(ctx, cmd.OutOrStdout(), releaseAfter, id, r)
					if err != nil {
						return err
					}
					if v.refused != "" {
						fmt.Fprintln(cmd.OutOrStdout(), v.line(""))
						errs = append(errs, v.err)
					}
					vs = append(vs, v.verdict)
				}
				return refusals(vs, errs)
			})
		},
	}
	cmd.Flags().BoolVar(&releaseAfter, "release-parked", false,
		"skip the discarded event in its subject's sequence and apply the events parked behind it (strict_order)")
	resolutionFlags(cmd, &r)
	return cmd
}

// parkedCommand returns the command that lists the events parked behind
// dead letters, per subject.
func parkedCommand(opts fx.Option) *cobra.Command {
	var filter driver.ParkedFilter
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
				op.noteUndeclared(cmd.ErrOrStderr(), filter.Consumer)
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

// discarded is the verdict of a discard, with the error behind its
// refusal.
type discarded struct {
	verdict
	err error
}

// discard marks the dead letter id discarded with r (its history keeps
// it), and tells out what becomes of the events parked behind it: they
// stay parked unless release (--release-parked), which skips the dead
// letter in its subject's sequence and records the parked events whose
// turn came as replays to the consumer (Store.AddReplays), which the
// running service publishes. With release, a dead letter discarded before
// is accepted, and out told that this discard is not recorded (its
// history keeps the first). A dead letter that is not found or not
// pending is refused.
func (op operator) discard(ctx context.Context, out io.Writer, release bool, id int64, r driver.Resolution) (discarded, error) {
	refuse := func(why string, err error) (discarded, error) {
		return discarded{verdict: verdict{id: id, refused: why}, err: fmt.Errorf("dead letter %d: %w", id, err)}, nil
	}
	dl, err := op.deadLetters.DeadLetter(ctx, id)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		return refuse("not found", err)
	case err != nil:
		return discarded{}, fmt.Errorf("dead letter %d: %w", id, err)
	case release && dl.Subject != "" && !slices.Contains(op.consumers, dl.Consumer):
		why := fmt.Sprintf("consumer %s is not declared in this service: nothing would apply its parked events", dl.Consumer)
		return refuse(why, errors.New(why))
	}
	again := release && dl.Status == driver.DeadLetterDiscarded
	if !again {
		_, err := op.deadLetters.ResolveDeadLetter(ctx, id, r)
		switch {
		case errors.Is(err, driver.ErrNotPending):
			if dl, err = op.deadLetters.DeadLetter(ctx, id); err != nil {
				return discarded{}, fmt.Errorf("dead letter %d: %w", id, err)
			}
			return refuse(notPending(dl), driver.ErrNotPending)
		case errors.Is(err, driver.ErrNotFound):
			return refuse("not found", err)
		case err != nil:
			return discarded{}, fmt.Errorf("discard dead letter %d: %w", id, err)
		}
	}
	v := discarded{verdict: verdict{id: id, dl: dl}}
	if again {
		// Nothing is recorded of this discard: say so, rather than that it
		// was discarded now with this --by and --reason.
		fmt.Fprintf(out, "dead letter %d was discarded before, by %s at %s (%s): this discard is not recorded\n",
			id, printable(orDash(dl.Resolution.By)), dl.Resolution.At.UTC().Format(time.RFC3339), printable(dl.Resolution.Reason))
	} else {
		fmt.Fprintf(out, "dead letter %d discarded\n", id)
	}
	if !release {
		return v, op.reportParked(ctx, out, dl, "they stay parked: discard it again with --release-parked to apply them")
	}
	if dl.Subject == "" {
		return v, nil
	}
	return v, op.releaseParked(ctx, out, dl)
}

// releaseParked skips the discarded dl in its subject's sequence and
// records the events parked behind it whose turn came as replays to its
// consumer, in their order.
func (op operator) releaseParked(ctx context.Context, out io.Writer, dl driver.DeadLetter) error {
	parked, err := op.parkedBehind(ctx, dl)
	if err != nil {
		return err
	}
	if _, err := op.deadLetters.Skip(ctx, dl.Consumer, dl.Subject, dl.Key()); err != nil && !errors.Is(err, driver.ErrNotFound) {
		return fmt.Errorf("dead letter %d: skip it in the sequence of %s: %w", dl.ID, dl.Subject, err)
	} // not found: skipped before, or nothing was held behind it
	ready, err := op.deadLetters.Parked(ctx, driver.ParkedFilter{Consumer: dl.Consumer, Subject: dl.Subject, Ready: true})
	if err != nil {
		return err
	}
	rs := make([]driver.Replay, 0, len(ready))
	for _, p := range ready {
		rs = append(rs, parkedReplay(p))
	}
	if len(rs) > 0 {
		if err := op.deadLetters.AddReplays(ctx, rs); err != nil {
			return fmt.Errorf("dead letter %d: release the events parked behind it: %w", dl.ID, err)
		}
	}
	_, err = fmt.Fprintf(out, "%d events of subject %s parked behind it are released to %s, to be applied in order (the running service publishes them)\n",
		len(parked), printable(dl.Subject), dl.Consumer)
	return err
}

// parkedBehind returns the events parked behind dl (see
// driver.ParkedBehind).
func (op operator) parkedBehind(ctx context.Context, dl driver.DeadLetter) ([]driver.ParkedEvent, error) {
	if dl.Subject == "" {
		return nil, nil
	}
	ps, err := op.deadLetters.Parked(ctx, driver.ParkedFilter{Consumer: dl.Consumer, Subject: dl.Subject})
	if err != nil {
		return nil, err
	}
	return driver.ParkedBehind(dl, ps), nil
}

// reportParked tells out how many events are parked behind dl, and what
// becomes of them, when there are any.
func (op operator) reportParked(ctx context.Context, out io.Writer, dl driver.DeadLetter, fate string) error {
	parked, err := op.parkedBehind(ctx, dl)
	if err != nil || len(parked) == 0 {
		return err
	}
	_, err = fmt.Fprintf(out, "%d events of subject %s are parked behind it: %s\n", len(parked), printable(dl.Subject), fate)
	return err
}

// parkedReplay is the replay of the parked event p to its consumer: its
// body and metadata, without the transport's redelivery marker.
func parkedReplay(p driver.ParkedEvent) driver.Replay {
	md := make(map[string]string, len(p.Metadata))
	for k, v := range p.Metadata {
		if k != framework.MetadataRedelivered {
			md[k] = v
		}
	}
	return driver.Replay{Consumer: p.Consumer, Topic: p.Topic, Body: p.Body, Metadata: md}
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("dead letter id %q: want a positive integer", s)
	}
	return id, nil
}

// parseIDs returns the ids of args, each once, in their order: a dead
// letter named twice is acted on once, as a dry run says, not refused the
// second time as resolved by the operator himself.
func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	seen := make(map[int64]bool, len(args))
	for _, a := range args {
		id, err := parseID(a)
		if err != nil {
			return nil, err
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func printList(out io.Writer, dls []driver.DeadLetter) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tCONSUMER\tCODE\tTYPE\tVERSION\tSOURCE\tEVENT\tATTEMPTS\tREPEATS\tLAST FAILED\tSTATUS")
	for _, dl := range dls {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\n",
			dl.ID, dl.Consumer, dl.Code, printable(orDash(dl.Type)), dl.Version, printable(orDash(dl.Source)), printable(dl.EventID),
			dl.Attempts, dl.Repeats, dl.LastFailedAt.UTC().Format(time.RFC3339), dl.Status)
	}
	return w.Flush()
}

func printDeadLetter(out io.Writer, dl driver.DeadLetter) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(w, "%s\t%s\n", printable(k), printable(fmt.Sprint(v))) }
	row("id", dl.ID)
	row("consumer", dl.Consumer)
	row("topic", dl.Topic)
	row("code", dl.Code)
	row("status", dl.Status)
	if dl.Status != driver.DeadLetterPending {
		row("resolved", fmt.Sprintf("%s by %s at %s: %s", dl.Resolution.Status, dl.Resolution.By, dl.Resolution.At.UTC().Format(time.RFC3339), dl.Resolution.Reason))
	}
	row("source", orDash(dl.Source))
	row("event id", dl.EventID)
	row("type", fmt.Sprintf("%s v%d", orDash(dl.Type), dl.Version))
	if dl.SubjectSeq > 0 {
		row("subject", fmt.Sprintf("%s #%d", dl.Subject, dl.SubjectSeq))
	} else {
		row("subject", orDash(dl.Subject))
	}
	row("correlation id", orDash(dl.CorrelationID))
	row("attempts", dl.Attempts)
	row("deliveries", countOrUnknown(dl.Deliveries))
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
	var pretty bytes.Buffer
	if json.Indent(&pretty, dl.Body, "", "  ") == nil {
		// Indented as it is, not decoded and encoded again, which sorted
		// the members, kept one of two with the same name (the cause of a
		// malformed_envelope) and rounded large numbers.
		for line := range strings.Lines(pretty.String()) {
			fmt.Fprintf(out, "  %s\n", printable(strings.TrimSuffix(line, "\n")))
		}
		return nil
	}
	_, err := fmt.Fprintf(out, "  %q\n", dl.Body)
	return err
}

// countOrUnknown prints a delivery count, which is 0 when the store did
// not know it (a message dead-lettered before it was counted).
func countOrUnknown(n int) string {
	if n == 0 {
		return "unknown"
	}
	return strconv.Itoa(n)
}

// printHistory prints every failure and resolution of a dead letter,
// oldest first.
func printHistory(out io.Writer, hs []driver.HistoryEntry) error {
	fmt.Fprintln(out, "history:")
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, h := range hs {
		var what string
		switch h.Kind {
		case driver.HistoryFailed:
			what = fmt.Sprintf("code %s, attempts %d, deliveries %s", h.Code, h.Attempts, countOrUnknown(h.Deliveries))
		case driver.HistoryAdopted:
			what = "from consumer " + h.By
		default:
			what = fmt.Sprintf("by %s: %s", orDash(h.By), h.Reason)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\n", h.At.UTC().Format(time.RFC3339Nano), h.Kind, printable(what))
	}
	return w.Flush()
}

// printParked prints ps per consumer and subject: the dead letter they
// wait behind, their sequences, how many, and how many are ready.
func printParked(out io.Writer, ps []driver.ParkedEvent) error {
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
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\n", r.consumer, printable(r.subject), printable(orDash(r.held)),
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
