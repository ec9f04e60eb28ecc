package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/effectively-once/effectively/app/internal/bulk"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/printable"
)

// replayCommand returns the command that replays dead letters, named or
// selected by a filter.
func replayCommand(s Service) *cobra.Command {
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

--reason and --by (default $USER, else the OS user) are required, except for a dry run.`,
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
			}
			if err := bulk.CheckRate(perSecond); err != nil {
				return fmt.Errorf("--rate: %w", err)
			}
			req.resolution.Status = driver.DeadLetterReplayed
			if !req.dryRun {
				if err := checkResolution(req.resolution, "why the messages can be processed now"); err != nil {
					return err
				}
			}
			return operate(cmd.Context(), s, func(ctx context.Context, op operator) error {
				op.noteUndeclared(cmd.ErrOrStderr(), req.filter.Consumer)
				return op.replay(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), req, bulk.NewThrottle(perSecond))
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
func (op operator) replay(ctx context.Context, out, errOut io.Writer, req replayRequest, th *bulk.Throttle) error {
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

// replayPage is how many dead letters a bulk replay reads at once.
const replayPage = 500

// verdict is what a replay or discard command does with one dead letter:
// act on it, or refuse it and say why.
type verdict struct {
	id int64
	// dl is the dead letter; zero when there is none with id.
	dl driver.DeadLetter
	// refused says why the dead letter is not acted on; empty when it is.
	refused string
}

// line returns what the command prints of v: done says what it did.
func (v verdict) line(done string) string {
	if v.refused != "" {
		return fmt.Sprintf("dead letter %d refused: %s", v.id, v.refused)
	}
	return fmt.Sprintf("dead letter %d %s", v.id, done)
}

// dryLine returns what a dry run prints of v.
func (v verdict) dryLine() string {
	if v.refused != "" {
		return fmt.Sprintf("would refuse dead letter %d: %s", v.id, v.refused)
	}
	dl := v.dl
	subject := ""
	if dl.Subject != "" {
		subject = fmt.Sprintf(", subject %s #%d", printable.String(dl.Subject), dl.SubjectSeq)
	}
	return fmt.Sprintf("would replay dead letter %d: consumer %s, code %s, event %s%s, first failed %s",
		v.id, dl.Consumer, dl.Code, printable.String(dl.Key().String()), subject, dl.FirstFailedAt.UTC().Format(time.RFC3339))
}

// notPending says who resolved dl, when and why: the operator's words
// escaped, as every command prints what it did not write itself.
func notPending(dl driver.DeadLetter) string {
	r := dl.Resolution
	if r.By == "" && r.At.IsZero() {
		return fmt.Sprintf("not pending: %s", dl.Status)
	}
	return fmt.Sprintf("not pending: %s by %s at %s (%s)", dl.Status, printable.String(orDash(r.By)), r.At.UTC().Format(time.RFC3339), printable.String(r.Reason))
}

// refusedError is the error of a command that refused some of its dead
// letters: it went on with the others, and printed why for each. It
// wraps the errors behind the refusals (driver.ErrNotFound,
// driver.ErrNotPending), when there are any.
type refusedError struct {
	refused, total int
	errs           []error
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("%d of %d dead letters refused (each is said above)", e.refused, e.total)
}

func (e *refusedError) Unwrap() []error { return e.errs }

// dryRunError is the error of a dry run of a replay that would refuse
// some of its dead letters: the replay's exit status, before the replay.
type dryRunError struct{ *refusedError }

func (e *dryRunError) Error() string {
	return fmt.Sprintf("%d of %d dead letters would be refused (each is said above); nothing recorded", e.refused, e.total)
}

// refusals returns the error of a command that refused some of vs, nil
// when it refused none.
func refusals(vs []verdict, errs []error) error {
	n := 0
	for _, v := range vs {
		if v.refused != "" {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return &refusedError{refused: n, total: len(vs), errs: errs}
}

// replayRequest is what the replay command was asked.
type replayRequest struct {
	// ids are the dead letters named; empty for a bulk replay by filter.
	ids    []int64
	filter driver.DeadLetterFilter
	// resolution says who replays and why.
	resolution driver.Resolution
	dryRun     bool
	// force replays dead letters older than the processed-mark retention.
	force bool
}

// selectReplays returns what req asks to replay, in the order to publish
// it (see sortReplays), each with its verdict.
func (op operator) selectReplays(ctx context.Context, req replayRequest, now time.Time) ([]verdict, []error, error) {
	var (
		vs   []verdict
		errs []error
	)
	if len(req.ids) > 0 {
		for _, id := range req.ids {
			dl, err := op.deadLetters.DeadLetter(ctx, id)
			switch {
			case errors.Is(err, driver.ErrNotFound):
				vs = append(vs, verdict{id: id, refused: "not found"})
				errs = append(errs, fmt.Errorf("dead letter %d: %w", id, err))
			case err != nil:
				return nil, nil, fmt.Errorf("dead letter %d: %w", id, err)
			default:
				vs = append(vs, verdict{id: id, dl: dl})
			}
		}
	} else {
		f := req.filter
		f.Status = driver.DeadLetterPending
		f.Limit = replayPage
		// Without their bodies, which may be as large as the transport's
		// limit: the store reads each as it records its replay.
		f.WithoutBody = true
		for {
			dls, err := op.deadLetters.DeadLetters(ctx, f)
			if err != nil {
				return nil, nil, fmt.Errorf("list dead letters: %w", err)
			}
			for _, dl := range dls {
				vs = append(vs, verdict{id: dl.ID, dl: dl})
			}
			if len(dls) < f.Limit {
				break
			}
			f.AfterID = dls[len(dls)-1].ID
		}
	}
	sortReplays(vs)
	for i := range vs {
		if vs[i].refused == "" {
			vs[i].refused = op.refuseReplay(vs[i].dl, req.force, now)
			if vs[i].refused != "" && vs[i].dl.Status != driver.DeadLetterPending {
				errs = append(errs, fmt.Errorf("dead letter %d: %w", vs[i].id, driver.ErrNotPending))
			}
		}
	}
	return vs, errs, nil
}

// sortReplays orders vs as a replay publishes them: the dead letters not
// found first (nothing is published of them), then per consumer and
// subject by subject sequence (numerically), then by first failure, so
// that each subject's events come again in their order.
func sortReplays(vs []verdict) {
	slices.SortStableFunc(vs, func(a, b verdict) int {
		if (a.dl.ID == 0) != (b.dl.ID == 0) {
			if a.dl.ID == 0 {
				return -1
			}
			return 1
		}
		return cmp.Or(
			cmp.Compare(a.dl.Consumer, b.dl.Consumer),
			cmp.Compare(a.dl.Subject, b.dl.Subject),
			cmp.Compare(a.dl.SubjectSeq, b.dl.SubjectSeq),
			a.dl.FirstFailedAt.Compare(b.dl.FirstFailedAt),
			cmp.Compare(a.dl.ID, b.dl.ID),
		)
	})
}

// refuseReplay says why dl cannot be replayed now, or "" when it can: it
// is not pending, its consumer is not declared in this service (nothing
// would consume the replay), or, unless force, it first failed before the
// processed-mark retention window: a copy of its event that took effect
// since may have lost its mark, and the replay would apply it again.
func (op operator) refuseReplay(dl driver.DeadLetter, force bool, now time.Time) string {
	retention := op.cfg.Retentions.Processed
	switch {
	case dl.Status != driver.DeadLetterPending:
		return notPending(dl)
	case !slices.Contains(op.consumers, dl.Consumer):
		return fmt.Sprintf("consumer %s is not declared in this service: nothing would consume the replay", dl.Consumer)
	case !force && retention > 0 && dl.FirstFailedAt.Before(now.Add(-retention)):
		return fmt.Sprintf("first failed at %s, longer ago than processed_retention (%s): a duplicate could no longer be detected (--force replays it anyway)",
			dl.FirstFailedAt.UTC().Format(time.RFC3339), retention)
	}
	return ""
}

// replayAll records the replay of each dead letter of vs that is not
// refused (Store.ResolveDeadLetter: the mark and the replay in one
// transaction), at the pace of th, and prints per dead letter what it did
// to out, with a progress bar pr. One that another operator resolved in
// the meantime is refused, saying by whom. It returns the errors behind
// the refusals it adds.
func (op operator) replayAll(ctx context.Context, out io.Writer, vs []verdict, r driver.Resolution, th *bulk.Throttle, pr *progress) ([]error, error) {
	var errs []error
	for i := range vs {
		v := &vs[i]
		if v.refused == "" {
			if err := th.Wait(ctx); err != nil {
				return errs, err
			}
			if err := op.replayOne(ctx, v, r); err != nil {
				return errs, err
			}
			if v.refused != "" {
				errs = append(errs, fmt.Errorf("dead letter %d: %w", v.id, driver.ErrNotPending))
			}
		}
		pr.println(out, v.line("replayed"))
		if v.refused == "" {
			if err := op.reportParked(ctx, out, v.dl, "they are applied after it, in order, once it takes effect"); err != nil {
				return errs, err
			}
		}
		pr.add()
	}
	pr.finish()
	return errs, nil
}

// replayOne records the replay of v's dead letter, or refuses it when it
// is no longer pending (resolved by someone else since it was read).
func (op operator) replayOne(ctx context.Context, v *verdict, r driver.Resolution) error {
	_, err := op.deadLetters.ResolveDeadLetter(ctx, v.id, r)
	switch {
	case errors.Is(err, driver.ErrNotPending):
		dl, gerr := op.deadLetters.DeadLetter(ctx, v.id)
		if gerr != nil {
			return fmt.Errorf("dead letter %d: %w", v.id, gerr)
		}
		v.refused = notPending(dl)
		return nil
	case errors.Is(err, driver.ErrNotFound):
		v.refused = "not found"
		return nil
	case err != nil:
		return fmt.Errorf("replay dead letter %d: %w", v.id, err)
	}
	return nil
}

// parseTime reads a time flag: RFC 3339, or a date (midnight UTC).
func parseTime(flag, s string) (time.Time, error) {
	t, err := bulk.ParseTime(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s: %w", flag, err)
	}
	return t, nil
}
