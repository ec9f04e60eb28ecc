package driver

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// Tx is the transaction of one attempt, as the handler and the stores see
// it: the statements of sqlx.ExtContext, and hooks that run when the
// attempt's effect commits or rolls back. Under group commit several
// attempts share one database transaction, one after another, with no
// savepoint between them: Tx has no Commit or Rollback, so no handler can
// end the transaction of its batch-mates, and a statement runs under the
// batch's own context (a canceled attempt fails its next statement
// instead of interrupting the shared connection). Each run of an attempt
// has a Tx of its own: when a batch-mate's failure rolls the batch back,
// the attempt runs again with a new one. On PostgreSQL, after an
// attempt that set something (SET, set_config), the batch runs RESET ALL
// before the next attempt, so settings never leak from one attempt to the
// next; locks it took do. Without a database (the in-memory store) it
// runs no statement; its hooks still run.
type Tx struct {
	tx            *sqlx.Tx
	ctx           context.Context // the context of the database transaction
	afterCommit   []func()
	afterRollback []func()
	// setsSession is true once a statement of the attempt may have changed
	// a setting of the session (SET, set_config): the batch resets them
	// before its next attempt.
	setsSession bool
	// failed is true once a statement of the attempt failed. On SQLite
	// a failed statement may have ended the whole transaction (a
	// conflict clause OR ROLLBACK, RAISE(ROLLBACK) in a trigger, a full
	// disk): the batch checks that it is still open before its next
	// attempt, should the handler have returned nil all the same.
	failed bool
	// ended is set once the attempt returned, its handler and the
	// framework's steps after it (the crash points) done: a statement
	// given a context of the attempt's (a goroutine the handler started
	// and left running) is refused with ErrAttemptEnded, since the
	// transaction is its batch-mates' now.
	ended atomic.Bool
	// inStatements is the time the attempt's statements took, until each
	// returned (rows read after it are not counted): the rest of its
	// handler's time went outside the database (see group.observe).
	inStatements time.Duration

	// queue, set in a batch on a store that can (see execQueuer), holds
	// the attempt's writes that wait to run with its batch-mates'.
	queue *execQueue

	// begin, when set, begins the database transaction at the attempt's
	// first statement, and makes the attempt's own first statements (see
	// UnitOfWork.deferred): until then the attempt holds no connection.
	// db is then the unit of work's, for DriverName and the like.
	begin    func() (*sqlx.Tx, error)
	db       *sqlx.DB
	beginMu  sync.Mutex
	began    bool
	beginErr error
}

// OnCommit registers f to run after the attempt's effect committed.
//
// Hooks run on the goroutine of the batch's transaction, which may be a
// batch-mate's. A hook that panics (OnCommit or OnRollback) keeps neither
// the other hooks, its attempt's or its batch-mates', from running, nor
// the consumer's next batches from starting: its panic goes on up from
// its own attempt's UnitOfWork.Do, once the attempt's result is set, as
// a handler's does.
func (t *Tx) OnCommit(f func()) { t.afterCommit = append(t.afterCommit, f) }

// OnRollback registers f to run after the attempt's effect rolled back or
// failed to commit: by its own failure, or by a batch-mate's that rolled
// back their shared transaction, after which the attempt runs again (with
// a new Tx, whose hooks are registered anew).
func (t *Tx) OnRollback(f func()) { t.afterRollback = append(t.afterRollback, f) }

// HasDB reports whether t is a database transaction (false for the
// in-memory store's attempts).
func (t *Tx) HasDB() bool { return t != nil && (t.begin != nil || t.tx != nil) }

// open begins t's transaction when it is deferred and has not begun (see
// Tx.begin), once: a failure to begin fails every statement after it.
func (t *Tx) open() error {
	t.beginMu.Lock()
	defer t.beginMu.Unlock()
	if !t.began {
		t.began = true
		start := time.Now()
		t.tx, t.beginErr = t.begin()
		t.inStatements += time.Since(start)
	}
	return t.beginErr
}

// deferredLost reports whether t's deferred transaction failed to begin,
// or to settle, with errDeferredLost.
func (t *Tx) deferredLost() bool {
	t.beginMu.Lock()
	defer t.beginMu.Unlock()
	return errors.Is(t.beginErr, errDeferredLost)
}

// current returns t's database transaction, nil when it has none (or
// its deferred one has not begun).
func (t *Tx) current() *sqlx.Tx {
	if t.begin == nil {
		return t.tx
	}
	t.beginMu.Lock()
	defer t.beginMu.Unlock()
	return t.tx
}

// errNoDB is what a statement returns on a Tx without a database.
var errNoDB = errors.New("attempt transaction: no database (the unit of work has no DB)")

// stmt returns the context a statement of ctx runs under: the
// transaction's own, so that ctx ending never interrupts a statement of
// a shared connection, unless ctx has ended already: then database/sql
// fails the statement before the driver sees it. write reports that
// query is a single write (see scanStatements).
func (t *Tx) stmt(ctx context.Context, query string) (sctx context.Context, write bool, err error) {
	if t.begin != nil {
		if err := t.open(); err != nil {
			return nil, false, err
		}
	}
	if t.tx == nil {
		return nil, false, errNoDB
	}
	if t.ended.Load() {
		if _, ok := pipeline.From[pipeline.Attempt](ctx); ok {
			return nil, false, framework.ErrAttemptEnded
		}
	}
	sc := scanStatements(query, t.tx.DriverName() == "pgx")
	if sc.ends {
		return nil, false, framework.ErrEndsTransaction
	}
	t.setsSession = t.setsSession || sc.sets
	if ctx.Err() != nil || t.ctx == nil {
		return ctx, sc.write, nil
	}
	return t.ctx, sc.write, nil
}

// ExecContext executes a statement in the attempt's transaction. In a
// batch that queues its writes (see Tx.queue), a single write whose
// arguments the store can hold waits in the queue instead.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	sctx, write, err := t.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if write && t.queue != nil && !t.setsSession {
		if queued, ok := t.queue.store.QueueArgs(args); ok {
			return t.queue.add(t, query, queued), nil
		}
	}
	if err := t.flush(); err != nil {
		return nil, err
	}
	start := time.Now()
	res, err := t.tx.ExecContext(sctx, query, args...)
	t.inStatements += time.Since(start)
	t.failed = t.failed || err != nil
	return res, err
}

// QueryContext queries in the attempt's transaction.
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	sctx, _, err := t.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if err := t.flush(); err != nil {
		return nil, err
	}
	start := time.Now()
	rows, err := t.tx.QueryContext(sctx, query, args...)
	t.inStatements += time.Since(start)
	t.failed = t.failed || err != nil
	return rows, err
}

// QueryxContext queries in the attempt's transaction, returning sqlx.Rows.
func (t *Tx) QueryxContext(ctx context.Context, query string, args ...any) (*sqlx.Rows, error) {
	sctx, _, err := t.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if err := t.flush(); err != nil {
		return nil, err
	}
	start := time.Now()
	rows, err := t.tx.QueryxContext(sctx, query, args...)
	t.inStatements += time.Since(start)
	t.failed = t.failed || err != nil
	return rows, err
}

// QueryRowxContext queries at most one row in the attempt's transaction.
// On a Tx without a database it panics, like a nil *sqlx.Tx, and so it
// does with ErrEndsTransaction for a statement that would end the
// transaction.
func (t *Tx) QueryRowxContext(ctx context.Context, query string, args ...any) *sqlx.Row {
	sctx, _, err := t.stmt(ctx, query)
	if err != nil {
		panic(err)
	}
	// A failed flush aborted the transaction: the query then fails
	// (SQLSTATE 25P02), and the batch runs each attempt again alone.
	_ = t.flush()
	start := time.Now()
	row := t.tx.QueryRowxContext(sctx, query, args...)
	t.inStatements += time.Since(start)
	t.failed = t.failed || row.Err() != nil
	return row
}

// flush runs the statements that wait in t's batch (see Tx.queue), before
// a statement that must see their effects or run after them; their time
// counts as t's time in statements.
func (t *Tx) flush() error {
	if t.queue == nil {
		return nil
	}
	start := time.Now()
	err := t.queue.flush()
	t.inStatements += time.Since(start)
	t.failed = t.failed || err != nil
	return err
}

// GetContext scans one row into dest (see sqlx.GetContext).
func (t *Tx) GetContext(ctx context.Context, dest any, query string, args ...any) error {
	return sqlx.GetContext(ctx, t, dest, query, args...)
}

// SelectContext scans rows into dest (see sqlx.SelectContext).
func (t *Tx) SelectContext(ctx context.Context, dest any, query string, args ...any) error {
	return sqlx.SelectContext(ctx, t, dest, query, args...)
}

// DriverName returns the name of the database's driver.
func (t *Tx) DriverName() string { return t.binder().DriverName() }

// Rebind turns a query's ? placeholders into the driver's bindvars.
func (t *Tx) Rebind(query string) string { return t.binder().Rebind(query) }

// BindNamed binds a query's named parameters from arg (see sqlx.BindNamed).
func (t *Tx) BindNamed(query string, arg any) (string, []any, error) {
	return t.binder().BindNamed(query, arg)
}

// binder is t's transaction, or its unit of work's database while its
// transaction is deferred and has not begun.
func (t *Tx) binder() interface {
	DriverName() string
	Rebind(string) string
	BindNamed(string, any) (string, []any, error)
} {
	if tx := t.current(); tx != nil || t.db == nil {
		return tx
	}
	return t.db
}

// committed runs the OnCommit hooks, each one, and returns the first
// panic of one, nil when none panicked.
func (t *Tx) committed() (panicked any) { return runHooks(t.afterCommit) }

// rolledBack runs the OnRollback hooks, each one, and returns the first
// panic of one, nil when none panicked.
func (t *Tx) rolledBack() (panicked any) { return runHooks(t.afterRollback) }

// runHooks runs each of hooks, and returns the first panic of one.
func runHooks(hooks []func()) (panicked any) {
	for _, f := range hooks {
		if p := runHook(f); p != nil && panicked == nil {
			panicked = p
		}
	}
	return panicked
}

// runHook runs f and returns its panic, nil when it returned.
func runHook(f func()) (panicked any) {
	defer func() { panicked = recover() }()
	f()
	return nil
}

// TxFromContext returns the transaction of the attempt running in ctx. Code
// that a handler calls (a repository, a command bus) joins the attempt
// through it, so its writes commit or roll back with the processed mark.
func TxFromContext(ctx context.Context) (*Tx, bool) {
	t, ok := pipeline.From[*Tx](ctx)
	if !ok || !t.HasDB() {
		return nil, false
	}
	return t, true
}
