package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
	"golang.org/x/time/rate"
)

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
