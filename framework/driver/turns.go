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

// take removes the next batch from the waiting attempts, nil when none
// waits. The attempts of strict-order subjects go by lane (see laneOf):
// a batch takes those of one lane that no running batch holds, the
// oldest first, and the others as they come. Call it with g.mu held.
func (g *group) take() []*attemptRun {
	if len(g.waiting) == 0 {
		return nil
	}
	lane := -1
	for _, a := range g.waiting {
		if a.lane >= 0 && g.lanes&(1<<a.lane) == 0 {
			lane = a.lane
			break
		}
	}
	batch := make([]*attemptRun, 0, min(len(g.waiting), g.size))
	kept := g.waiting[:0]
	held := false // the batch holds an attempt of lane: lane is its
	for _, a := range g.waiting {
		if len(batch) < g.size && (a.lane < 0 || a.lane == lane) {
			batch = append(batch, a)
			held = held || a.lane >= 0
		} else {
			kept = append(kept, a)
		}
	}
	clear(g.waiting[len(kept):])
	g.waiting = kept
	if len(g.waiting) == 0 {
		g.waiting = nil // let the backing array go
	}
	if len(batch) == 0 {
		return nil
	}
	if held {
		// Only then: freeLanes frees the lanes of the batch's attempts,
		// and a lane held by none would never be free again.
		g.lanes |= 1 << lane
	}
	return batch
}

// laneOf is the lane of a: for an attempt of a strict-order subject, a
// hash of its subject among the group's batch slots; -1 otherwise, and
// with a single slot. The subjects of one lane commit one batch after the
// other (see take), so a subject's events keep their order across
// batches, while the batches of other lanes run beside them: hot
// subjects' batches share the slots as unordered ones do.
func (g *group) laneOf(a *attemptRun) int {
	if a.delivery.OrderedSubject == "" || g.batches < 2 {
		return -1
	}
	return Bucket(a.delivery.OrderedSubject) % min(g.batches, 64)
}

// freeLanes lets the lane of batch, which ended, go to the next batch.
func (g *group) freeLanes(batch []*attemptRun) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range batch {
		if a.lane >= 0 {
			g.lanes &^= 1 << a.lane
		}
	}
}
