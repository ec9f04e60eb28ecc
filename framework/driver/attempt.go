package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// attemptRun is one call of Do: its input, and once it ran, its result.
type attemptRun struct {
	ctx      context.Context
	consumer string
	key      framework.Key
	fn       func(ctx context.Context) error

	delivery Delivery

	tx      *Tx
	marked  bool // first holds the mark's result: the batch marked it
	first   bool
	batched bool // a.tx is a batch's transaction (group commit)
	acking  bool // the batch writes a.delivery.Ack before its commit (see ackAll)
	fencing bool // the batch checks a.delivery's partition before its commit (see fenceAll)
	// order is a's strict-order step when its batch locked its subject's
	// checkpoint (see lockCheckpoints); nil otherwise.
	order *pipeline.OrderStep
	// after is the attempt of the event ahead of a's in its subject's
	// line (see pipeline.Turn), which runs first; nil when none.
	after *attemptRun
	// lane is a's lane in the group's queue (see group.laneOf); inLane
	// says that its batch took it for its lane, not to fill up (see
	// group.take).
	lane     int
	inLane   bool
	outcome  framework.Outcome
	err      error
	panicked any
	done     chan struct{}      // closed once the result is set (group commit)
	lead     chan []*attemptRun // hands this attempt a batch to run
	crash    crash.Hook         // the crash hook of ctx, nil without one
	died     crash.Point        // where the attempt died (see dies)
	// eager says that a runs alone with its transaction begun before its
	// handler, never deferred (see UnitOfWork.deferred).
	eager bool
	// joined is a's place in a deferred batch (see group.join), nil when
	// it joined none.
	joined *joining

	// hookPanicked is the first panic of one of a's OnCommit or
	// OnRollback hooks, of any run of a: Do panics with it once a's
	// result is set (see Tx.OnCommit).
	hookPanicked any
}

// fail sets a's result to err. An error that came once a's deadline had
// passed is the deadline's too, so that its dead letter says timeout: on
// PostgreSQL the batch's statement_timeout fails a statement that runs
// past it with an error of the server's own (SQLSTATE 57014), and the
// batch's context, which ends canceled once its attempts' contexts have
// (see batchContext), fails one with context.Canceled; the deadline
// caused both. (A cancel is no stop's unless the message's context
// ended: see the middleware's dead-letter step.)
func (a *attemptRun) fail(err error) {
	if cause := context.Cause(a.ctx); errors.Is(cause, context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w (past the attempt's deadline: %w)", err, cause)
	}
	a.outcome, a.err = framework.Failed, err
}

// dies reports whether a's crash hook makes a die at p, in ctx, and if so
// sets a's result: a *crash.Died.
func (a *attemptRun) dies(ctx context.Context, p crash.Point) bool {
	if a.crash == nil || !a.crash(ctx, p) {
		return false
	}
	a.die(p)
	return true
}

// die makes a die at p: its result is a *crash.Died, so that its delivery
// is not acknowledged.
func (a *attemptRun) die(p crash.Point) {
	a.died, a.outcome, a.err, a.panicked = p, framework.Failed, &crash.Died{At: p}, nil
}

// committed runs the OnCommit hooks of a's transaction (see Tx.OnCommit).
func (a *attemptRun) committed() { a.keepHookPanic(a.tx.committed()) }

// rolledBack runs the OnRollback hooks of a's transaction.
func (a *attemptRun) rolledBack() { a.keepHookPanic(a.tx.rolledBack()) }

// keepHookPanic keeps p, a hook's panic, unless one was kept before.
func (a *attemptRun) keepHookPanic(p any) {
	if a.hookPanicked == nil {
		a.hookPanicked = p
	}
}

// alone runs a in a transaction of its own.
func (u *UnitOfWork) alone(a *attemptRun) {
	a.tx, a.marked, a.batched, a.acking, a.fencing, a.order = &Tx{}, false, false, false, false, nil
	if u.db != nil {
		tx, err := u.db.BeginTxx(a.ctx, nil)
		if err != nil {
			a.fail(fmt.Errorf("begin: %w", err))
			return
		}
		a.tx.tx = tx
		// A partitioned consumer's attempt locks its partition's lease
		// from its fence to its commit (Leases.Fence): its transaction
		// ends idle past its deadline, as a batch's does (see
		// group.timeout), so that a process frozen before the commit
		// holds the lease from its next owner no longer.
		if timeout := txTimeout(u.db, []*attemptRun{a}); timeout != "" && a.delivery.Fencer != nil {
			if _, err := tx.ExecContext(a.ctx, timeout); err != nil {
				_ = tx.Rollback() // err is what matters
				a.fail(fmt.Errorf("statement timeout: %w", err))
				return
			}
		}
	}
	u.end(a, u.attempt(a))
}

// end ends a's transaction, which ran alone, once a ran: it commits when
// a wrote something to commit and succeeded, and rolls back otherwise.
func (u *UnitOfWork) end(a *attemptRun, write bool) {
	tx := a.tx.current()
	switch {
	case a.died != "" && (tx != nil || a.tx.begin != nil):
		// The process died: its transaction ends unfinished, its hooks
		// never run.
		if tx != nil {
			_ = tx.Rollback()
		}
	case a.err != nil || a.panicked != nil || !write:
		if tx != nil {
			_ = tx.Rollback() // the attempt's error is what matters
		}
		a.rolledBack() // without a database, the hooks are the rollback
	case tx != nil:
		if err := u.resetSession(a, tx); err != nil {
			_ = tx.Rollback() // err is what matters
			a.rolledBack()
			a.fail(err)
			return
		}
		if err := tx.Commit(); err != nil {
			a.rolledBack()
			a.fail(fmt.Errorf("commit: %w", err))
			return
		}
		if a.dies(a.ctx, crash.AfterCommit) {
			return
		}
		a.committed()
	default:
		a.committed() // without a database, the hooks are the commit
		a.dies(a.ctx, crash.AfterCommit)
	}
}

// resetSession undoes, on PostgreSQL, the settings that a's statements
// may have made (see Tx.setsSession) before its transaction commits: a
// plain SET or set_config(..., false) outlives the commit, on a
// connection of the pool that the next attempts take.
func (u *UnitOfWork) resetSession(a *attemptRun, tx *sqlx.Tx) error {
	if !a.tx.setsSession || u.db.DriverName() != "pgx" {
		return nil
	}
	if _, err := tx.ExecContext(a.ctx, "RESET ALL"); err != nil {
		return fmt.Errorf("reset the attempt's settings: %w", err)
	}
	return nil
}

// attempt runs a in a.tx: the mark, the handler, the delivery count and
// the transport's ack. It sets a's result, and reports whether a wrote
// anything to commit (a duplicate whose delivery was not counted writes
// nothing). A panic of the handler is kept in a.panicked.
func (u *UnitOfWork) attempt(a *attemptRun) (write bool) {
	defer func() {
		if r := recover(); r != nil {
			a.panicked, write = r, false
		}
	}()
	ctx, tx := a.ctx, a.tx
	// From its return on, the transaction is the batch's (see
	// ErrAttemptEnded): the crash points after the handler still query it.
	defer tx.ended.Store(true)
	if err := ctx.Err(); err != nil {
		a.fail(err)
		return false
	}
	first, err := a.first, error(nil)
	switch {
	case u.withoutMark:
		first = true
	case !a.marked:
		first, err = u.store.Mark(ctx, tx, a.consumer, a.key)
	}
	if err != nil {
		a.fail(fmt.Errorf("mark processed: %w", err))
		return false
	}
	a.outcome = framework.Duplicate
	if first {
		a.outcome = framework.Processed
		at := pipeline.Attempt{Consumer: a.consumer, Source: a.key.Source, ID: a.key.ID, Order: a.order}
		if tx.HasDB() {
			at.Conn = tx // framework.Conn's: a *Tx without a database is none
		}
		attemptCtx := pipeline.With(pipeline.With(ctx, tx), at)
		// A deferred transaction (see UnitOfWork.deferred) marks when it
		// begins.
		if tx.begin == nil && a.dies(attemptCtx, crash.AfterMark) {
			return false
		}
		start := time.Now()
		err := a.fn(attemptCtx)
		if u.group != nil {
			u.group.observe(time.Since(start) - tx.inStatements)
		}
		if a.died != "" {
			a.die(a.died) // at the mark of a deferred transaction
			return false
		}
		if err != nil {
			a.fail(dataException(err))
			return false
		}
		if a.dies(attemptCtx, crash.BeforeCommit) {
			return false
		}
		if err := ctx.Err(); err != nil {
			a.fail(err) // never commit an attempt cut short
			return false
		}
	} else if !a.delivery.Counted {
		return false // nothing to write: a duplicate costs the insert that found its mark
	}
	// A processed event, or a duplicate whose delivery was counted (its
	// ack was lost): forget the count, so that lost acks never add up to
	// the delivery limit.
	if a.delivery.Counted {
		if err := u.store.Forget(ctx, tx, a.consumer, a.key); err != nil {
			a.fail(fmt.Errorf("forget delivery count: %w", err))
			return false
		}
	}
	if f := a.delivery.Fencer; f != nil {
		if a.batched {
			a.fencing = true // checked with its batch-mates', before the commit (see fenceAll)
		} else if err := f.Fence(ctx, tx, []int{a.delivery.Partition}); err != nil {
			a.fail(fmt.Errorf("fence: %w", err))
			return false
		} else if a.dies(ctx, crash.AfterFence) {
			return false
		}
	}
	if ack := a.delivery.Ack; ack.Batch != nil && tx.HasDB() && ack.DB == u.db.DB {
		if a.batched {
			a.acking = true // acked with its batch-mates', before the commit (see ackAll)
			return true
		}
		if err := ack.Batch.AckInTx(ctx, tx, []any{ack.Item}); err != nil {
			a.fail(fmt.Errorf("ack in transaction: %w", err))
			return false
		}
	}
	return true
}
