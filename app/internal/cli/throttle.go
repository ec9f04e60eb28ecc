package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

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
