package driver

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/internal/bound"
	"github.com/effectively-once/effectively/internal/crash"
)

// group gathers attempts into batches that commit in one transaction
// (group commit). It has no goroutine of its own: the attempt that finds
// a batch slot free runs a batch, and each batch, once it committed,
// hands the next one to one of the attempts it holds. So every attempt
// runs on a goroutine of the router, no attempt waits behind batches it is
// not in, and a batch's runner returns as soon as its own attempt is done.
//
// A batch that could start while another runs waits, unless it is full,
// until that one ends: the attempts that arrive meanwhile join it. Under
// load this makes batches of many attempts instead of one transaction for
// the first attempt to arrive (which, on SQLite, would only wait for the
// writer's lock anyway); an idle consumer's attempt starts at once.
//
// A batch runs its attempts one after another, so the time a handler
// spends outside the database (an HTTP call) delays every attempt behind
// it. The group therefore keeps a moving average of that time (see
// observe): on PostgreSQL, while it is OutsideThreshold or more, the
// attempts overlap instead (see solo): each runs at once in a transaction
// of its own, up to Overlap at a time; so do the attempts of a batch
// about to start. Below half the threshold, attempts gather into batches
// again.
type group struct {
	u       *UnitOfWork
	size    int
	linger  time.Duration
	batches int

	mu       sync.Mutex
	free     int                     // batch slots not taken (by a collect, or a batch handed on or running)
	running  int                     // batches in runBatch, until they ended
	waiting  []*attemptRun           // attempts in no batch yet, oldest first
	lanes    uint64                  // the lanes of the running batches (see laneOf)
	held     map[subjectKey]struct{} // the strict-order subjects of the running batches (see take)
	full     chan struct{}           // closed when BatchSize attempts wait (while a batch lingers)
	finished chan struct{}           // closed when a batch ends (while a batch waits for one to)

	// overlap, nil when attempts never overlap (SQLite, Overlap 1),
	// holds a token for each attempt that runs alone while the handlers
	// wait outside the database (see solo).
	overlap     chan struct{}
	outside     atomic.Int64 // the moving average of observe, in nanoseconds
	overlapping atomic.Bool  // attempts overlap: outside reached OutsideThreshold

	// known are the strict-order checkpoints the batches committed (see
	// knownCheckpoints).
	known knownCheckpoints

	joinMu      sync.Mutex
	joins       []*attemptRun // deferred attempts at their first statement, in no batch yet (see join)
	joinLeading bool          // a goroutine runs deferred batches (see leadJoins)
}

// run runs a in a batch, or alone while the attempts overlap (see solo),
// and returns once its result is set.
func (g *group) run(a *attemptRun) {
	a.done = make(chan struct{})
	defer func() { a.after = nil }() // the attempts of a subject never chain up in memory
	if g.overlapping.Load() {
		g.mu.Lock()
		t := g.joinTurn(a)
		g.mu.Unlock()
		joined(t)
		g.solo(a)
		return
	}
	a.lead = make(chan []*attemptRun, 1)
	a.lane = g.laneOf(a)
	g.mu.Lock()
	g.waiting = append(g.waiting, a)
	t := g.joinTurn(a)
	if g.full != nil && len(g.waiting) >= g.size {
		close(g.full)
		g.full = nil
	}
	if g.free == 0 {
		g.mu.Unlock()
		joined(t)
	} else {
		g.free--
		if t != nil {
			// collect may wait for a batch to end: the event behind
			// a may join meanwhile.
			g.mu.Unlock()
			joined(t)
			g.mu.Lock()
		}
		batch := g.collect(a.ctx)
		g.mu.Unlock()
		if batch != nil {
			batch[0].lead <- batch
		}
	}
	for {
		select {
		case <-a.done:
			return
		case batch := <-a.lead:
			if batch == nil {
				g.solo(a) // its batch overlaps (below)
				return
			}
			if g.overlapping.Load() {
				// The handlers wait outside the database since the
				// batch was gathered: each of its attempts runs alone
				// on its own goroutine, and the slot is free at once.
				for _, b := range batch[1:] {
					b.lead <- nil
				}
				g.freeSubjects(batch)
				g.next()
				g.solo(a)
				return
			}
			g.runBatch(batch)
			g.next()
		}
	}
}

// next hands the slot of a batch that ended to the next batch, or frees
// it when no attempt waits.
func (g *group) next() {
	g.mu.Lock()
	g.wakeWaiting() // one that began waiting after this batch's transaction ended
	next := g.take()
	if next == nil {
		g.free++
	}
	g.mu.Unlock()
	if next != nil {
		next[0].lead <- next
	}
}

// collect takes the next batch for a free slot, after waiting for it to
// fill up to the linger, or, while another batch runs, until that one
// ends, or until ctx (the context of the attempt that collects) ends:
// its batch then starts, and drops it. It returns nil, and frees the
// slot, when another slot took every waiting attempt meanwhile. Call it
// with g.mu held; it lets go of it while it waits.
//
// Only a batch that runs makes it wait, never another slot's collect:
// two collects that each waited for the other's slot would wait until an
// attempt's context ended (two events of one subject arriving at an idle
// group do that: the first lets the second go as it joins the queue,
// before it collects).
func (g *group) collect(ctx context.Context) []*attemptRun {
	busy := g.running > 0 // its end is a batch's to gather behind
	if (g.linger > 0 || busy) && len(g.waiting) < g.size {
		if g.full == nil {
			g.full = make(chan struct{})
		}
		full := g.full
		var finished chan struct{}
		if busy {
			if g.finished == nil {
				g.finished = make(chan struct{})
			}
			finished = g.finished
		}
		g.mu.Unlock()
		var lingered <-chan time.Time
		if g.linger > 0 {
			timer := time.NewTimer(g.linger)
			defer timer.Stop()
			lingered = timer.C
		}
		select {
		case <-full:
		case <-lingered:
		case <-finished:
		case <-ctx.Done():
		}
		g.mu.Lock()
	}
	batch := g.take()
	if batch == nil {
		g.free++
	}
	return batch
}

// runBatch runs batch and sets the result of each of its attempts.
func (g *group) runBatch(batch []*attemptRun) {
	g.mu.Lock()
	g.running++ // until ended
	g.mu.Unlock()
	defer func() {
		g.freeSubjects(batch)
		for _, a := range batch {
			close(a.done)
		}
	}()
	awaitTurns(batch)
	if len(batch) == 1 {
		if !batch[0].lostTurn() {
			g.u.alone(batch[0])
		}
		g.ended()
		return
	}
	committed, retry := g.inTx(batch)
	g.ended()
	if died(batch) {
		return
	}
	for _, a := range committed {
		a.committed()
	}
	// A batch that could not commit: each of its attempts that had
	// succeeded runs again alone, before any of them is charged an attempt
	// for what may have been another's fault.
	for _, a := range inBatchOrder(batch, retry) {
		a.outcome, a.err, a.panicked = "", nil, nil
		if a.lostTurn() {
			continue
		}
		g.u.alone(a)
		if a.died != "" && died(batch) {
			return
		}
	}
}

// ended wakes the batch that waits for one to end, once this one's
// transaction did, and yields to it: it begins while this batch's
// attempts are told their results. A batch's result wakes each of its
// attempts, and each wake would put the waiting batch behind the one
// before it on this processor, the file's writer lock free meanwhile.
func (g *group) ended() {
	g.mu.Lock()
	g.running--
	woke := g.wakeWaiting()
	g.mu.Unlock()
	if woke {
		runtime.Gosched()
	}
}

// wakeWaiting wakes the batch that waits for one to end, and reports
// whether one waited. Call it with g.mu held.
func (g *group) wakeWaiting() bool {
	if g.finished == nil {
		return false
	}
	close(g.finished)
	g.finished = nil
	return true
}

// died reports whether an attempt of batch died at a crash point (see
// package internal/crash), and then makes every attempt of the batch die
// with it, as they would with their process: none is acknowledged, and no
// hook runs.
func died(batch []*attemptRun) bool {
	for _, a := range batch {
		if a.died == "" {
			continue
		}
		at := a.died
		for _, b := range batch {
			b.die(at)
		}
		return true
	}
	return false
}

// timeout returns the statement that bounds each statement of a batch's
// transaction on PostgreSQL by the earliest deadline of its attempts (SET
// LOCAL statement_timeout), so that a statement running past an
// attempt's deadline fails, failing that attempt, instead of the deadline
// interrupting the batch's connection; "" on SQLite, where an attempt's
// deadline acts between statements, and when no attempt has a deadline.
func (g *group) timeout(batch []*attemptRun) string { return txTimeout(g.u.db, batch) }

// txTimeout is group.timeout's statement for batch on db.
func txTimeout(db *sqlx.DB, batch []*attemptRun) string {
	if db.DriverName() != "pgx" {
		return ""
	}
	var earliest time.Time
	for _, a := range batch {
		if d, ok := a.ctx.Deadline(); ok && (earliest.IsZero() || d.Before(earliest)) {
			earliest = d
		}
	}
	if earliest.IsZero() {
		return ""
	}
	// At most PostgreSQL's most (bound.PostgresMillis, about 24.8 days):
	// a larger value failed the statement, and with it every batch of a
	// consumer whose timeout is longer.
	ms := bound.PostgresMillis(time.Until(earliest))
	// A process frozen (or cut off) while its batch's transaction waits
	// between statements cannot roll it back: the server ends it once
	// the batch's deadline passed, so that its locks (a partition's
	// lease, see Leases.Fence; a processed mark) hold no other process
	// for longer.
	idle := bound.PostgresMillis(time.Duration(ms)*time.Millisecond + idleGrace)
	return "SET LOCAL statement_timeout = " + strconv.FormatInt(ms, 10) +
		"; SET LOCAL idle_in_transaction_session_timeout = " + strconv.FormatInt(idle, 10)
}

// idleGrace is how long past its batch's deadline the server lets a
// transaction wait idle before it ends it (see group.timeout).
const idleGrace = 2 * time.Second

// inTx runs batch in one transaction, optimistically: the attempts run one
// after the other with no savepoint between them (a savepoint per attempt
// costs SQLite half its throughput, see docs/operations.md). When an
// attempt fails, the transaction rolls back, the failed attempt keeps its
// failure (and its OnRollback hooks run), and the others run again in a
// new transaction without it; their hooks of the rolled-back run run too.
// So an attempt's handler may run more than once for one delivery when a
// batch-mate fails: its effect still commits once.
//
// inTx returns the attempts whose effect committed, and those to run
// again alone because the commit failed after they had run: the ones that
// succeeded, and the duplicates, which may have been duplicates of an
// attempt whose effect then did not commit.
func (g *group) inTx(batch []*attemptRun) (committed, retry []*attemptRun) {
	for len(batch) > 0 {
		batch = dropLostTurns(g.dropEnded(batch))
		if len(batch) == 0 {
			break
		}
		committed, retry, failed := g.try(batch)
		if failed < 0 {
			return committed, retry
		}
		batch = append(batch[:failed:failed], batch[failed+1:]...)
		for _, a := range batch {
			a.outcome, a.err, a.panicked = "", nil, nil
		}
	}
	return nil, nil
}

// dropEnded fails the attempts of batch whose context ended already (a
// shutdown), without running them, and returns the others: they would
// fail in the transaction and cost the others a run.
func (g *group) dropEnded(batch []*attemptRun) []*attemptRun {
	live := batch[:0:0]
	for _, a := range batch {
		if err := a.ctx.Err(); err != nil {
			a.tx = &Tx{}
			a.fail(err)
			continue
		}
		live = append(live, a)
	}
	return live
}

// try runs batch once in a transaction (see inTx). failed is the index of
// the attempt that failed, after which the transaction rolled back, or -1.
func (g *group) try(batch []*attemptRun) (committed, retry []*attemptRun, failed int) {
	ctx, stop := batchContext(batch)
	defer stop()
	tx, queue, err := g.begin(ctx)
	if queue != nil {
		defer queue.conn.Close() // after the transaction ended: back to the pool
	}
	if err != nil {
		for _, a := range batch {
			a.tx = &Tx{}
			a.fail(fmt.Errorf("begin: %w", err))
		}
		return nil, nil, -1
	}
	timeout := g.timeout(batch)
	if timeout != "" {
		if _, err := tx.ExecContext(ctx, timeout); err != nil {
			c, r := g.abort(tx, batch, nil, nil, fmt.Errorf("statement timeout: %w", err))
			return c, r, -1
		}
	}
	// The batch's statements run under a context that never ends: one cut
	// short would roll back the whole batch on SQLite (an interrupt) and
	// close its connection on PostgreSQL (pgx). The batch ends when all
	// its attempts' contexts have: database/sql then rolls its transaction
	// back (it began under ctx). A statement without an end also costs no
	// watch of its context (modernc.org/sqlite starts a goroutine per
	// statement for one).
	ctx = context.WithoutCancel(ctx)
	if queue != nil {
		queue.ctx = ctx
	}
	for _, a := range batch {
		a.tx = &Tx{tx: tx, ctx: ctx, queue: queue}
		a.marked, a.batched, a.acking, a.fencing, a.order = false, true, false, false, nil
	}
	checkpoints, planned, err := g.markLock(ctx, batch)
	if err != nil {
		_ = tx.Rollback() // err is what matters: each attempt runs again alone
		return nil, batch, -1
	}
	var ok, settled []*attemptRun
	for i, a := range batch {
		checkpoint(checkpoints, a)
		write := g.u.attempt(a)
		switch {
		case a.died != "":
			// The process died: the batch's transaction ends
			// unfinished, no hook runs (see died).
			_ = tx.Rollback()
			return nil, nil, -1
		case queue != nil && queue.err != nil:
			// A statement that waited in the queue failed, maybe
			// not a's: every attempt runs again alone (see
			// execQueuer), as after an aborted transaction.
			a.rolledBack()
			c, r := g.abort(tx, nil, ok, settled, queue.err)
			return c, queueFailed(queue, append(r, batch[i:]...)), -1
		case a.err != nil && i > 0 && inFailedTransaction(a.err):
			// Not a's own failure, maybe: an attempt before it went on
			// after a statement of its own failed, which aborted the
			// transaction on PostgreSQL, and returned nil. Every attempt
			// runs again alone (see abort), before any is charged, as
			// after a failed commit: the one that aborted it then fails
			// its own commit.
			a.rolledBack()
			c, r := g.abort(tx, nil, ok, settled, a.err)
			return c, append(r, batch[i:]...), -1
		case a.err != nil || a.panicked != nil:
			_ = tx.Rollback() // a's failure is what matters
			a.rolledBack()
			for _, o := range ok {
				o.rolledBack()
			}
			return nil, nil, i
		case write:
			ok = append(ok, a)
			moved(checkpoints, a)
		default:
			settled = append(settled, a) // a duplicate: nothing to write
			a.rolledBack()
		}
		if a.tx.failed && g.txEnded(ctx, tx) {
			// A statement of a failed and ended the transaction, and
			// a returned nil: the attempts after it would write
			// outside any transaction, for good, and then run again.
			// Every attempt runs again alone, as after a failed commit:
			// a then fails its own commit.
			c, r := g.abort(tx, nil, ok, settled, errTxEnded)
			return c, append(r, batch[i+1:]...), -1
		}
		if a.tx.setsSession { // the last one's too: a plain SET outlives the commit
			if err := a.tx.flush(); err != nil {
				c, r := g.abort(tx, nil, ok, settled, err)
				return c, queueFailed(queue, append(r, batch[i+1:]...)), -1
			}
			if err := g.resetSession(ctx, tx, timeout); inFailedTransaction(err) {
				c, r := g.abort(tx, nil, ok, settled, err) // as above
				return c, append(r, batch[i+1:]...), -1
			} else if err != nil {
				c, r := g.abort(tx, batch[i+1:], ok, settled, err)
				return c, r, -1
			}
		}
	}
	if queue != nil {
		if err := queue.flush(); err != nil {
			c, r := g.abort(tx, nil, ok, settled, err)
			return c, queueFailed(queue, r), -1
		}
	}
	if len(ok) == 0 {
		_ = tx.Rollback() // nothing to commit
		return nil, nil, -1
	}
	advanced, err := g.advanceAll(ctx, ok, planned)
	if err != nil {
		// A subject with a wait, a parked event or a skip at or after
		// its step, or a failure: each attempt runs again alone, and
		// ends its wait or parks as strict order says.
		c, r := g.abort(tx, nil, ok, settled, err)
		return c, r, -1
	}
	if err := fenceAll(ctx, ok); err != nil {
		// Each attempt runs again alone, and checks its own partition:
		// those of the partitions still owned commit.
		c, r := g.abort(tx, nil, ok, settled, err)
		return c, r, -1
	}
	for _, a := range ok {
		if a.fencing && a.dies(a.ctx, crash.AfterFence) {
			_ = tx.Rollback() // the batch dies unfinished (see died): no hook runs
			return nil, nil, -1
		}
	}
	if err := ackAll(ctx, ok); err != nil {
		c, r := g.abort(tx, nil, ok, settled, fmt.Errorf("ack in transaction: %w", err))
		return c, r, -1
	}
	if err := tx.Commit(); err != nil {
		for _, a := range ok {
			a.rolledBack()
		}
		return nil, append(ok, settled...), -1
	}
	if len(advanced) > 0 {
		g.known.committed(ok[0].consumer, advanced)
	}
	for _, a := range ok {
		if a.dies(a.ctx, crash.AfterCommit) {
			return nil, nil, -1 // the batch dies (see died): no hook runs
		}
	}
	return ok, nil, -1
}

// abort rolls back a batch's transaction that failed with err: the
// attempts of rest, not run yet, fail with err (they are retried like any
// failed attempt); those of ok, which had succeeded, roll back (their
// hooks run) and run again alone, as do the duplicates of settled.
func (g *group) abort(tx interface{ Rollback() error }, rest, ok, settled []*attemptRun, err error) (committed, retry []*attemptRun) {
	_ = tx.Rollback() // err is what matters
	for _, a := range ok {
		a.rolledBack()
	}
	for _, a := range rest {
		if a.tx == nil {
			a.tx = &Tx{}
		}
		a.fail(err)
	}
	return nil, append(ok, settled...)
}
