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
// waits. The attempts of strict-order subjects go by subject: a batch
// takes those of the subjects no running batch holds, and holds the
// subjects it took until it ends (see freeSubjects), so that a subject's
// batches run one after the other. It takes first, the oldest first, the
// unordered attempts and those of one lane (see laneOf) that no running
// batch took, and then, to fill up, those of the other lanes: with few
// subjects (hot keys) each lane's batches keep a slot busy, with many
// (cold keys) a batch is as full as an unordered one. Call it with g.mu
// held.
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
	var (
		batch = make([]*attemptRun, 0, min(len(g.waiting), g.size))
		took  []subjectKey // the subjects the batch holds
		held  = false      // the batch holds an attempt of lane: lane is its
	)
	for fill := range 2 {
		passed := false // an attempt of another lane, left for the fill
		kept := g.waiting[:0]
		for i, a := range g.waiting {
			if len(batch) == g.size {
				kept = append(kept, g.waiting[i:]...)
				break
			}
			other := fill == 0 && a.lane >= 0 && a.lane != lane
			if other || !g.takes(a, &took) {
				passed = passed || other
				kept = append(kept, a)
				continue
			}
			batch = append(batch, a)
			a.inLane = fill == 0 && a.lane >= 0
			held = held || a.inLane
		}
		clear(g.waiting[len(kept):])
		g.waiting = kept
		if !passed || len(batch) == g.size {
			break // nothing for the fill to take
		}
	}
	if len(g.waiting) == 0 {
		g.waiting = nil // let the backing array go
	}
	if len(batch) == 0 {
		return nil
	}
	if held {
		// Only then: freeSubjects frees the lane of the batch's
		// attempts, and a lane held by none would never be free again.
		g.lanes |= 1 << lane
	}
	if g.held == nil && len(took) > 0 {
		g.held = make(map[subjectKey]struct{}, len(took))
	}
	for _, k := range took {
		g.held[k] = struct{}{}
	}
	return batch
}

// subjectKey is a strict-order subject of a consumer, as the running
// batches hold it (see take).
type subjectKey struct{ consumer, subject string }

// takes reports whether the batch being taken, which holds the subjects
// of took, may take a: a is unordered (no lane), or its subject is one the
// batch holds already or one no running batch holds, which the batch then
// holds (added to took).
func (g *group) takes(a *attemptRun, took *[]subjectKey) bool {
	if a.lane < 0 {
		return true
	}
	k := subjectKey{a.consumer, a.delivery.OrderedSubject}
	if slices.Contains(*took, k) {
		return true
	}
	if _, held := g.held[k]; held {
		return false
	}
	*took = append(*took, k)
	return true
}

// laneOf is the lane of a: for an attempt of a strict-order subject, a
// hash of its subject among the group's batch slots; -1 otherwise, and
// with a single slot. A batch takes one free lane's attempts first (see
// take), so that the batches of few subjects share the slots as
// unordered ones do.
func (g *group) laneOf(a *attemptRun) int {
	if a.delivery.OrderedSubject == "" || g.batches < 2 {
		return -1
	}
	return Bucket(a.delivery.OrderedSubject) % min(g.batches, 64)
}

// freeSubjects lets the subjects and the lane of batch, which ended, go to
// the next batches.
func (g *group) freeSubjects(batch []*attemptRun) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range batch {
		if a.inLane {
			g.lanes &^= 1 << a.lane
		}
		if a.lane >= 0 {
			delete(g.held, subjectKey{a.consumer, a.delivery.OrderedSubject})
		}
	}
}
