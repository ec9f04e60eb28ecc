package driver

import (
	"slices"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// This file keeps the events of a subject in their order inside the
// group's batches (see pipeline.Turn): the runner lets an ordered event
// go to its chain once the event ahead of it joined the group's queue, so
// that both may share a batch, the later one after the other in the
// transaction, where it sees the other's effect (its checkpoint's move).
// An attempt behind one that failed does not run: it fails with
// pipeline.ErrTurn, and the runner runs its chain again once the event
// ahead is done.

// joinTurn links a, an attempt of a strict-order event, behind the latest
// attempt of the event ahead of it in its subject's line, and makes a the
// latest attempt of its own event. It returns a's turn, nil when a has
// none: the caller tells it that a joined (pipeline.Turn.Joined) once it
// let go of g.mu. Call it with g.mu held, as a joins the queue.
func (g *group) joinTurn(a *attemptRun) *pipeline.Turn {
	if a.delivery.OrderedSubject == "" {
		return nil
	}
	t, ok := pipeline.From[*pipeline.Turn](a.ctx)
	if !ok || t == nil {
		return nil
	}
	if t.Ahead != nil {
		a.after, _ = t.Ahead.Attempt.(*attemptRun)
	}
	t.Attempt = a
	return t
}

// joined tells t, when set, that its event's attempt joined the queue.
func joined(t *pipeline.Turn) {
	if t != nil && t.Joined != nil {
		t.Joined()
	}
}

// succeeded reports whether a's result, which is final, let the event
// behind it run: its effect took, or it was a duplicate, stale or parked.
func (a *attemptRun) succeeded() bool {
	return a.err == nil && a.panicked == nil && a.died == ""
}

// awaitTurns waits, before batch runs, until the attempt ahead of each of
// its attempts that runs in another batch (or alone) has its result. That
// batch was taken from the queue before this one, so it never waits for
// this one. An attempt whose context ends meanwhile stops waiting: the
// batch drops it unrun.
func awaitTurns(batch []*attemptRun) {
	for _, a := range batch {
		if p := a.after; p != nil && !slices.Contains(batch, p) {
			select {
			case <-p.done:
			case <-a.ctx.Done():
			}
		}
	}
}

// lostTurn reports whether the attempt ahead of a, whose result is final,
// did not let a run (see succeeded); then a fails with pipeline.ErrTurn,
// unrun.
func (a *attemptRun) lostTurn() bool {
	if a.after == nil || a.after.succeeded() {
		return false
	}
	a.tx = &Tx{}
	a.fail(pipeline.ErrTurn)
	return true
}

// dropLostTurns fails, unrun, the attempts of batch whose attempt ahead
// ran before it (in an earlier batch or an earlier run of this batch's
// transaction) and failed, and returns the others, in order. An attempt
// ahead that is still in batch runs first in the transaction: if it
// fails, the batch runs again without it, and the attempt behind it is
// dropped then.
func dropLostTurns(batch []*attemptRun) []*attemptRun {
	live := batch[:0:0]
	for _, a := range batch {
		if p := a.after; p != nil && slices.Contains(live, p) {
			live = append(live, a)
			continue
		}
		if !a.lostTurn() {
			live = append(live, a)
		}
	}
	return live
}

// inBatchOrder returns the attempts of some, all of batch, in the order
// of batch: the order in which a subject's events run.
func inBatchOrder(batch, some []*attemptRun) []*attemptRun {
	ordered := make([]*attemptRun, 0, len(some))
	for _, a := range batch {
		if slices.Contains(some, a) {
			ordered = append(ordered, a)
		}
	}
	return ordered
}
