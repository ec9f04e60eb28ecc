package driver

import "time"

// This file holds how group commit adapts to where the attempts' time
// goes (see group): while the handlers wait outside the database, the
// attempts overlap, each alone, instead of running one after another in
// a batch.

// observe adds d, the time a handler of the group spent outside its
// statements, to the moving average (weight 1/8) that decides whether
// the group's attempts overlap: from OutsideThreshold on they do, and
// below half of it they gather into batches again.
func (g *group) observe(d time.Duration) {
	if g.overlap == nil {
		return
	}
	d = max(d, 0)
	for {
		old := g.outside.Load()
		avg := old + (int64(d)-old)/8
		if !g.outside.CompareAndSwap(old, avg) {
			continue
		}
		switch {
		case avg >= int64(OutsideThreshold):
			g.overlapping.Store(true)
		case avg < int64(OutsideThreshold)/2:
			g.overlapping.Store(false)
		}
		return
	}
}

// solo runs a alone, in a transaction of its own, as soon as fewer than
// Overlap of the group's attempts do: while the handlers wait outside
// the database, the attempts overlap instead of waiting for each other
// in a batch. An attempt whose context ends while it waits for its turn
// fails unrun.
func (g *group) solo(a *attemptRun) {
	defer close(a.done)
	if p := a.after; p != nil {
		// Its turn comes once the attempt ahead has its result, which
		// it waits for holding no token: that one may need it.
		select {
		case <-p.done:
		case <-a.ctx.Done():
			a.tx = &Tx{}
			a.fail(a.ctx.Err())
			return
		}
		if a.lostTurn() {
			return
		}
	}
	if g.u.defers(a) && g.u.deferred(a) {
		return
	}
	g.aloneWithToken(a)
}

// aloneWithToken runs a alone (UnitOfWork.alone) holding one of the
// group's overlap tokens, or fails it unrun when its context ends first.
func (g *group) aloneWithToken(a *attemptRun) {
	if !g.token(a) {
		return
	}
	defer g.untoken()
	g.u.alone(a)
}

// token takes one of the group's overlap tokens for a, which is about to
// hold a connection of its own: its transaction, begun before its
// handler runs, or the statement that peeks before a deferred one (see
// UnitOfWork.deferred). So Overlap bounds the connections that the
// overlapping attempts hold, not how many of them wait outside the
// database at once: a deferred attempt holds none while its handler
// waits. It reports false, a failed unrun, when a's context ends first.
func (g *group) token(a *attemptRun) bool {
	select {
	case g.overlap <- struct{}{}:
		return true
	case <-a.ctx.Done():
		a.tx = &Tx{}
		a.fail(a.ctx.Err())
		return false
	}
}

// untoken gives back a token of token.
func (g *group) untoken() { <-g.overlap }
