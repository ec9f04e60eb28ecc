package driver

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// This file holds the attempts whose transaction begins at their
// handler's first statement: while a consumer's handlers wait outside
// the database (see group.observe), an attempt that runs alone holds no
// connection, and no transaction stays open, while its handler waits.

// peeker is a Store that reads, outside any transaction, whether an event
// is marked and its subject's checkpoint (the SQL stores do).
type peeker interface {
	Peek(ctx context.Context, consumer string, key framework.Key, subject string) (processed bool, checkpoint int64, err error)
}

// errDeferredLost fails the first statement of an attempt whose
// transaction began at it when what the attempt read before its handler
// ran no longer holds: another delivery of its event marked it, or its
// subject's checkpoint moved. The attempt then runs again, its
// transaction begun before its handler (see UnitOfWork.deferred).
var errDeferredLost = errors.New("the event was marked, or its subject's checkpoint moved, while the handler ran outside its transaction")

// defers reports whether a, about to run alone while the group's handlers
// wait outside the database, runs with its transaction begun at its
// handler's first statement: on PostgreSQL, with a store that peeks and
// moves checkpoints as batches do, when a marks its event.
func (u *UnitOfWork) defers(a *attemptRun) bool {
	if a.eager || u.withoutMark || u.db == nil || u.db.DriverName() != "pgx" {
		return false
	}
	if _, ok := u.store.(peeker); !ok {
		return false
	}
	_, ok := u.store.(orderBatcher)
	return ok
}

// deferred runs a alone with its transaction begun at its handler's first
// statement (or, when it makes none, once it returned). Before the handler
// runs, one statement outside any transaction reads whether the event is
// marked and its subject's checkpoint: a processed event is a duplicate,
// at no more cost. The transaction's first statements then set its
// timeouts, mark the event and lock the checkpoint, and check that the
// mark is new and the checkpoint as read; when not (another delivery of
// the event, or a move of the partition, came meanwhile), the attempt
// runs again as alone runs it, its transaction begun before its handler.
// It reports false, having run nothing, when a must run as alone runs it
// (a duplicate whose delivery was counted: its count is forgotten in a
// transaction).
func (u *UnitOfWork) deferred(a *attemptRun) bool {
	subject := a.delivery.OrderedSubject
	processed, checkpoint, err := u.store.(peeker).Peek(a.ctx, a.consumer, a.key, subject)
	switch {
	case err != nil:
		a.tx = &Tx{}
		a.fail(err)
		return true
	case processed && a.delivery.Counted:
		return false
	case processed:
		a.tx = &Tx{}
		a.outcome = framework.Duplicate
		return true
	}
	a.tx = &Tx{db: u.db}
	a.tx.begin = func() (*sqlx.Tx, error) { return u.begin(a, checkpoint) }
	a.marked, a.first, a.batched, a.acking, a.fencing, a.order = true, true, false, false, false, nil
	if subject != "" {
		a.order = &pipeline.OrderStep{Checkpoint: checkpoint}
	}
	write := u.attempt(a)
	if write && a.err == nil && a.panicked == nil && a.died == "" {
		u.settle(a)
	}
	if a.tx.deferredLost() && a.died == "" {
		// What the attempt read no longer holds: it runs again, its
		// handler's effect rolled back, its transaction begun first.
		if tx := a.tx.current(); tx != nil {
			_ = tx.Rollback() // nothing of it commits
		}
		a.rolledBack()
		a.outcome, a.err, a.panicked, a.eager = "", nil, nil, true
		u.alone(a)
		return true
	}
	u.end(a, write)
	return true
}

// begin begins a's deferred transaction: it sets the transaction's
// timeouts when a's partition is fenced, marks a's event and locks its
// subject's checkpoint, and fails with errDeferredLost when the mark is
// not new or the checkpoint is not the one read before the handler ran.
func (u *UnitOfWork) begin(a *attemptRun, checkpoint int64) (*sqlx.Tx, error) {
	tx, err := u.db.BeginTxx(a.ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	fail := func(err error) (*sqlx.Tx, error) {
		_ = tx.Rollback() // err is what matters
		return nil, err
	}
	if timeout := txTimeout(u.db, []*attemptRun{a}); timeout != "" && a.delivery.Fencer != nil {
		if _, err := tx.ExecContext(a.ctx, timeout); err != nil {
			return fail(fmt.Errorf("statement timeout: %w", err))
		}
	}
	own := &Tx{tx: tx}
	first, err := u.store.Mark(a.ctx, own, a.consumer, a.key)
	switch {
	case err != nil:
		return fail(fmt.Errorf("mark processed: %w", err))
	case !first:
		return fail(errDeferredLost)
	case a.dies(a.ctx, crash.AfterMark):
		return fail(a.err)
	}
	if subject := a.delivery.OrderedSubject; subject != "" {
		c, err := u.store.Checkpoint(a.ctx, own, a.consumer, subject)
		switch {
		case err != nil:
			return fail(err)
		case c != checkpoint:
			return fail(errDeferredLost)
		}
	}
	return tx, nil
}

// settle makes what a deferred attempt a that took effect still owes its
// transaction: the transaction itself when its handler made no statement,
// and the move of its subject's checkpoint its strict-order step asked
// for (see pipeline.OrderStep), which, when a wait, a parked event or a
// skip is at or after it, makes the attempt run again as alone runs it
// (errDeferredLost), so that its step ends the wait or parks.
func (u *UnitOfWork) settle(a *attemptRun) {
	if err := a.tx.open(); err != nil {
		if !errors.Is(err, errDeferredLost) && a.died == "" {
			a.fail(err)
		}
		return
	}
	if a.order == nil || !a.order.Advance {
		return
	}
	clear, err := u.store.(orderBatcher).AdvanceMany(a.ctx, a.tx, a.consumer, []string{a.delivery.OrderedSubject}, []int64{a.order.Seq})
	switch {
	case err != nil:
		a.fail(fmt.Errorf("advance the checkpoint of %s: %w", a.delivery.OrderedSubject, err))
	case !clear:
		a.tx.loseDeferred()
	}
}
