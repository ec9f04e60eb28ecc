package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"go.uber.org/dig"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework/driver"
)

// startError is an error of building an application, told by its cause:
// fx and dig wrap the error of a constructor in the chain of every
// constructor that needed its result, each with its file and line, and a
// reader needs only the cause, which names the fix. It unwraps to the
// whole chain.
type startError struct {
	err error
}

func (e *startError) Error() string { return describe(e.err) }

func (e *startError) Unwrap() error { return e.err }

// explain returns err as a startError when fx or dig wrapped it, and err
// itself otherwise.
func explain(err error) error {
	var de dig.Error
	if err == nil || !errors.As(err, &de) {
		return err
	}
	return &startError{err: err}
}

// sourceLocation matches the " (path/file.go:42)" that dig writes after a
// function's name.
var sourceLocation = regexp.MustCompile(` \([^()]*\.(go|s):[0-9]+\)`)

// describe returns the cause of err, an error wrapped by fx and dig: the
// error of the constructor that failed, or, when the wiring itself is
// wrong (a type nothing provides), dig's own error without file paths.
func describe(err error) string {
	cause := dig.RootCause(err)
	var de dig.Error
	if !errors.As(cause, &de) {
		return cause.Error() // a constructor's or an invoked function's error
	}
	msg := sourceLocation.ReplaceAllString(cause.Error(), "")
	if strings.HasPrefix(msg, "missing type") {
		msg += " (a constructor of the service or of a handler takes it, and no option gives it: provide or supply it among the service's options)"
	}
	return msg
}

// oneLine returns msg on one line: the lines of a joined error are
// separated by "; ", or by a space after a line that ends with a colon.
func oneLine(msg string) string {
	var b strings.Builder
	for l := range strings.Lines(msg) {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		if b.Len() > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(l)
	}
	return b.String()
}

// logDeviations logs, at start, where the consumers deliberately give up
// part of the exactly-once effect, at warn level so that the default
// logger shows it: one line per consumer that runs without deduplication
// (handlers.WithoutDedup), with its reason, and one line when the store
// keeps its marks outside the database transaction (see
// driver.MarkReleasedOnRollback), naming the consumers that rely on
// them. A store whose marks outlive a rollback never gets here: the mark
// check refused it when the router was built.
func logDeviations(ctx context.Context, logger *slog.Logger, consumers []runner.ConsumerConfig, store driver.Store) {
	var deduplicating []string
	for _, cc := range consumers {
		if cc.WithoutDedup == "" {
			deduplicating = append(deduplicating, cc.Consumer.Name())
			continue
		}
		logger.WarnContext(ctx, "consumer runs without deduplication: every delivery runs its handler, a redelivery too",
			"consumer", cc.Consumer.Name(), "reason", cc.WithoutDedup)
	}
	if len(deduplicating) > 0 && driver.MarkScopeOf(store) == driver.MarkReleasedOnRollback {
		logger.WarnContext(ctx, "processed store keeps its marks outside the database transaction: a crash or a restart forgets them, and an event delivered again then takes effect again",
			"store", fmt.Sprintf("%T", store), "consumers", strings.Join(deduplicating, ","))
	}
}
