package pipeline

import (
	"errors"
	"fmt"
)

// Turn is the place of an ordered event in its subject's line in the
// process: the runner's sequencer puts a *Turn on the context of each
// event of a strict-order consumer that has a subject, and the unit of
// work of package driver keeps the subject's events in that order inside
// its batches.
//
// An event goes to the chain once the event before it in the line (Ahead)
// joined the unit of work's queue (Joined), not once it took effect: the
// two may then share a batch, the event after the other in the batch's
// transaction, or the later one runs in a later batch. When the attempt
// of the event ahead fails, the unit of work fails the attempt behind it
// with ErrTurn without running it; the runner waits until the chain of
// the event ahead returned (Wait), and runs the chain of the event again,
// with no event ahead.
type Turn struct {
	// Ahead is the turn of the subject's event before this one whose
	// chain had not returned when this one was let go; nil when none.
	Ahead *Turn
	// Joined is called by the unit of work, at most once an attempt and
	// on a goroutine that must not wait, once an attempt of the event has
	// its place in the unit of work's queue, ahead of any later event of
	// the subject: the sequencer may let the next one go. Nil does
	// nothing.
	Joined func()
	// Attempt is the unit of work's latest attempt of the event, which
	// an attempt of the next event runs behind; only the unit of work
	// reads and writes it, under a lock of its own.
	Attempt any

	done chan struct{}
}

// NewTurn returns the turn of an event behind ahead (nil: none), which
// calls joined once an attempt of it joined the unit of work's queue.
func NewTurn(ahead *Turn, joined func()) *Turn {
	return &Turn{Ahead: ahead, Joined: joined, done: make(chan struct{})}
}

// Done says that the event's chain returned for good: the events behind
// it that lost their turn may run again. Call it once.
func (t *Turn) Done() { close(t.done) }

// Ended returns a channel closed once Done was called.
func (t *Turn) Ended() <-chan struct{} { return t.done }

// ErrTurn fails an attempt of an ordered event, unrun, because the
// attempt of the event ahead of it in its subject's line failed: its turn
// has not come. It wraps ErrLater: neither retried nor dead-lettered nor
// counted; the runner runs the event's chain again once the chain of the
// event ahead returned.
var ErrTurn = fmt.Errorf("the event ahead of it in its subject's line did not take effect: %w", ErrLater)

// LostTurn reports whether err is ErrTurn.
func LostTurn(err error) bool { return errors.Is(err, ErrTurn) }
