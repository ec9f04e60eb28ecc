package framework

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// group gathers attempts into batches that commit in one transaction
// (group commit). It has no goroutine of its own: the attempt that finds
// a batch slot free runs a batch, and each batch, once it committed,
// hands the next one to one of the attempts it holds. So every attempt
// runs on a goroutine of the router, no attempt waits behind batches it is
// not in, and a batch's runner returns as soon as its own attempt is done.
type group struct {
	u      *UnitOfWork
	size   int
	linger time.Duration

	mu      sync.Mutex
	free    int           // batch slots not running
	waiting []*attemptRun // attempts in no batch yet, oldest first
	full    chan struct{} // closed when BatchSize attempts wait (while a batch lingers)
}

// run runs a in a batch and returns once its result is set.
func (g *group) run(a *attemptRun) {
	a.done = make(chan struct{})
	a.lead = make(chan []*attemptRun, 1)
	g.mu.Lock()
	g.waiting = append(g.waiting, a)
	if g.full != nil && len(g.waiting) >= g.size {
		close(g.full)
		g.full = nil
	}
	var batch []*attemptRun
	if g.free > 0 {
		g.free--
		batch = g.collect()
	}
	g.mu.Unlock()
	if batch != nil {
		batch[0].lead <- batch
	}
	for {
		select {
		case <-a.done:
			return
		case batch := <-a.lead:
			g.runBatch(batch)
			g.mu.Lock()
			next := g.take()
			if next == nil {
				g.free++
			}
			g.mu.Unlock()
			if next != nil {
				next[0].lead <- next
			}
		}
	}
}

// collect takes the next batch for a free slot, after waiting up to the
// linger for it to fill. It returns nil, and frees the slot, when another
// slot took every waiting attempt meanwhile. Call it with g.mu held; it
// lets go of it while it waits.
func (g *group) collect() []*attemptRun {
	if g.linger > 0 && len(g.waiting) < g.size {
		if g.full == nil {
			g.full = make(chan struct{})
		}
		full := g.full
		g.mu.Unlock()
		timer := time.NewTimer(g.linger)
		select {
		case <-full:
		case <-timer.C:
		}
		timer.Stop()
		g.mu.Lock()
	}
	batch := g.take()
	if batch == nil {
		g.free++
	}
	return batch
}

// take removes the next batch from the waiting attempts, nil when none
// waits. Call it with g.mu held.
func (g *group) take() []*attemptRun {
	n := min(len(g.waiting), g.size)
	if n == 0 {
		return nil
	}
	batch := make([]*attemptRun, n)
	copy(batch, g.waiting)
	g.waiting = g.waiting[n:]
	if len(g.waiting) == 0 {
		g.waiting = nil // let the backing array go
	}
	return batch
}

// runBatch runs batch and sets the result of each of its attempts.
func (g *group) runBatch(batch []*attemptRun) {
	defer func() {
		for _, a := range batch {
			close(a.done)
		}
	}()
	if len(batch) == 1 {
		g.u.alone(batch[0])
		return
	}
	committed, retry := g.inTx(batch)
	for _, a := range committed {
		a.tx.committed()
	}
	// A batch that could not commit: each of its attempts that had
	// succeeded runs again alone, before any of them is charged an attempt
	// for what may have been another's fault.
	for _, a := range retry {
		a.outcome, a.err, a.panicked = "", nil, nil
		g.u.alone(a)
	}
}

// savepoint names the savepoint of the i-th attempt of a batch.
func savepoint(i int) string { return "effectively_attempt_" + strconv.Itoa(i) }

// begin returns the statement that starts the i-th attempt of a batch: its
// savepoint, and on PostgreSQL the attempt's statement timeout (SET LOCAL
// statement_timeout), so that a statement running past the attempt's
// deadline fails, rolling back the attempt alone, instead of the
// deadline interrupting the batch's connection. Earlier attempts'
// savepoints stay open until the commit, which releases them all: no
// RELEASE round trip per attempt. (PostgreSQL runs a string of several
// statements without parameters as one round trip.)
func (g *group) begin(ctx context.Context, i int) string {
	stmt := "SAVEPOINT " + savepoint(i)
	if g.u.db.DriverName() != "pgx" {
		return stmt
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return stmt + "; SET LOCAL statement_timeout TO DEFAULT"
	}
	ms := max(time.Until(deadline).Milliseconds(), 1)
	return stmt + "; SET LOCAL statement_timeout = " + strconv.FormatInt(ms, 10)
}

// inTx runs batch in one transaction, each attempt after a savepoint of
// its own. It returns the attempts whose effect committed, and those to
// run again alone because the transaction failed after they had run: the
// ones that succeeded, and the duplicates, which may have been duplicates
// of an attempt whose effect then did not commit. An attempt that fails
// rolls back to its savepoint alone, with its OnRollback hooks run at
// once; so does a duplicate, which has nothing to write.
func (g *group) inTx(batch []*attemptRun) (committed, retry []*attemptRun) {
	ctx, stop := batchContext(batch)
	defer stop()
	tx, err := g.u.db.BeginTxx(ctx, nil)
	if err != nil {
		for _, a := range batch {
			a.tx = &Tx{}
			a.fail(fmt.Errorf("begin: %w", err))
		}
		return nil, nil
	}
	var ok, settled []*attemptRun
	for i, a := range batch {
		a.tx = &Tx{tx: tx, ctx: ctx}
		if _, err := tx.ExecContext(ctx, g.begin(a.ctx, i)); err != nil {
			return g.abort(tx, batch[i:], ok, settled, fmt.Errorf("savepoint: %w", err))
		}
		write := g.u.attempt(a)
		if write && a.err == nil && a.panicked == nil {
			ok = append(ok, a)
			continue
		}
		if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint(i)); err != nil {
			a.tx.rolledBack()
			if a.err == nil && a.panicked == nil {
				settled = append(settled, a)
			}
			return g.abort(tx, batch[i+1:], ok, settled, fmt.Errorf("roll back to savepoint: %w", err))
		}
		a.tx.rolledBack()
		if a.err == nil && a.panicked == nil {
			settled = append(settled, a)
		}
	}
	if len(ok) == 0 {
		_ = tx.Rollback() // nothing to commit
		return nil, nil
	}
	if err := tx.Commit(); err != nil {
		for _, a := range ok {
			a.tx.rolledBack()
		}
		return nil, append(ok, settled...)
	}
	return ok, nil
}

// abort rolls back a batch's transaction that failed with err: the
// attempts of rest, not run yet, fail with err (they are retried like any
// failed attempt); those of ok, which had succeeded, roll back (their
// hooks run) and run again alone, as do the duplicates of settled.
func (g *group) abort(tx interface{ Rollback() error }, rest, ok, settled []*attemptRun, err error) (committed, retry []*attemptRun) {
	_ = tx.Rollback() // err is what matters
	for _, a := range ok {
		a.tx.rolledBack()
	}
	for _, a := range rest {
		if a.tx == nil {
			a.tx = &Tx{}
		}
		a.fail(err)
	}
	return nil, append(ok, settled...)
}

// batchContext returns the context of a batch's transaction: the values
// of the first attempt's context, not its end, so that no attempt's
// cancellation interrupts the others' statements; it ends when every
// attempt's context has ended, since no one waits for the batch then.
func batchContext(batch []*attemptRun) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, a := range batch {
		stops[i] = context.AfterFunc(a.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
