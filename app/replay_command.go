package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
	"golang.org/x/time/rate"

	"github.com/effectively-once/effectively/framework/driver"
)

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
		subject = fmt.Sprintf(", subject %s #%d", printable(dl.Subject), dl.SubjectSeq)
	}
	return fmt.Sprintf("would replay dead letter %d: consumer %s, code %s, event %s%s, first failed %s",
		v.id, dl.Consumer, dl.Code, printable(dl.Key().String()), subject, dl.FirstFailedAt.UTC().Format(time.RFC3339))
}

// notPending says who resolved dl, when and why: the operator's words
// escaped, as every command prints what it did not write itself.
func notPending(dl driver.DeadLetter) string {
	r := dl.Resolution
	if r.By == "" && r.At.IsZero() {
		return fmt.Sprintf("not pending: %s", dl.Status)
	}
	return fmt.Sprintf("not pending: %s by %s at %s (%s)", dl.Status, printable(orDash(r.By)), r.At.UTC().Format(time.RFC3339), printable(r.Reason))
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
	retention := time.Duration(op.cfg.ProcessedRetention)
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
func (op operator) replayAll(ctx context.Context, out io.Writer, vs []verdict, r driver.Resolution, th *throttle, pr *progress) ([]error, error) {
	var errs []error
	for i := range vs {
		v := &vs[i]
		if v.refused == "" {
			if err := th.wait(ctx); err != nil {
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

// throttle spaces the replays a command records: at most its rate per
// second, so that the relay publishes them at that pace. A nil throttle
// does not wait.
type throttle struct {
	limiter *rate.Limiter
	now     func() time.Time
	sleep   func(ctx context.Context, d time.Duration) error
}

// newThrottle returns the throttle of perSecond replays a second, nil for
// zero (no limit).
func newThrottle(perSecond float64) *throttle {
	if perSecond <= 0 {
		return nil
	}
	return &throttle{limiter: rate.NewLimiter(rate.Limit(perSecond), 1), now: time.Now, sleep: sleep}
}

// wait waits for the next replay's turn.
func (t *throttle) wait(ctx context.Context) error {
	if t == nil {
		return nil
	}
	now := t.now()
	r := t.limiter.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		return t.sleep(ctx, d)
	}
	return nil
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// progress is a progress bar of a command's dead letters, drawn on a
// terminal only; a nil progress draws nothing.
type progress struct {
	bar *progressbar.ProgressBar
}

// newProgress returns a progress bar of total dead letters on w when w
// is a terminal and there is more than one; nil otherwise.
func newProgress(w io.Writer, total int) *progress {
	f, ok := w.(*os.File)
	if !ok || total < 2 || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return drawProgress(w, total)
}

// drawProgress returns a progress bar of total dead letters drawn on w.
func drawProgress(w io.Writer, total int) *progress {
	return &progress{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("replaying"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetItsString("dead letters"),
		progressbar.OptionShowIts(),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)}
}

// println prints line to out, clearing the bar first: on a terminal out
// and the bar share the screen.
func (p *progress) println(out io.Writer, line string) {
	if p != nil {
		_ = p.bar.Clear()
	}
	fmt.Fprintln(out, line)
}

// add counts one more dead letter done.
func (p *progress) add() {
	if p != nil {
		_ = p.bar.Add(1)
	}
}

// finish clears the bar.
func (p *progress) finish() {
	if p != nil {
		_ = p.bar.Finish()
	}
}

// parseTime reads a time flag: RFC 3339, or a date (midnight UTC).
func parseTime(flag, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		if t, err = time.Parse(time.DateOnly, s); err != nil {
			return time.Time{}, fmt.Errorf("--%s: want an RFC 3339 time (2026-01-02T15:04:05Z) or a date (2026-01-02), got %q", flag, s)
		}
	}
	if t.IsZero() {
		// 0001-01-01, the zero time, which a filter reads as no bound: the
		// next nanosecond selects what it says.
		t = t.Add(time.Nanosecond)
	}
	return t, nil
}
