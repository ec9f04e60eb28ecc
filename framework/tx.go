package framework

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/internal/crash"
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
func (t *Tx) HasDB() bool { return t != nil && t.tx != nil }

// errNoDB is what a statement returns on a Tx without a database.
var errNoDB = errors.New("attempt transaction: no database (the unit of work has no DB)")

// ErrEndsTransaction is what a statement of an attempt returns, not run,
// when it would begin or end a transaction (BEGIN, START TRANSACTION,
// COMMIT, END, ROLLBACK, ABORT, PREPARE TRANSACTION): the framework
// commits the attempt's transaction, with its processed mark and those
// of its batch-mates. A COMMIT run by a handler would commit the mark
// before the handler succeeded, so its failure would be taken for a
// duplicate on the next attempt, and its effect half done. Every
// statement of a query that holds several is checked, whatever white
// space and comments come before it, as the database reads them
// (PostgreSQL's or SQLite's rules). ROLLBACK TO and RELEASE of a
// savepoint of the handler's own run as usual.
var ErrEndsTransaction = errors.New("attempt transaction: a statement may not begin or end the transaction, which the framework commits with the processed mark (return an error to roll the attempt back)")

// ErrAttemptEnded is returned by a statement of the attempt's transaction
// run with the attempt's context after its handler returned, from a
// goroutine the handler left running: the transaction goes on with the
// handler's batch-mates, whose effect, or rollback, the statement would
// join. Finish the attempt's writes before the handler returns.
var ErrAttemptEnded = errors.New("attempt transaction: the attempt's handler returned; its transaction is its batch-mates' now")

// stmt returns the context a statement of ctx runs under: the
// transaction's own, so that ctx ending never interrupts a statement of
// a shared connection, unless ctx has ended already: then database/sql
// fails the statement before the driver sees it.
func (t *Tx) stmt(ctx context.Context, query string) (context.Context, error) {
	if t.tx == nil {
		return nil, errNoDB
	}
	if t.ended.Load() {
		if _, ok := pipeline.From[attempt](ctx); ok {
			return nil, ErrAttemptEnded
		}
	}
	ends, sets := scanStatements(query, t.tx.DriverName() == "pgx")
	if ends {
		return nil, ErrEndsTransaction
	}
	t.setsSession = t.setsSession || sets
	if ctx.Err() != nil || t.ctx == nil {
		return ctx, nil
	}
	return t.ctx, nil
}

// ExecContext executes a statement in the attempt's transaction.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	sctx, err := t.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	res, err := t.tx.ExecContext(sctx, query, args...)
	t.failed = t.failed || err != nil
	return res, err
}

// QueryContext queries in the attempt's transaction.
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	sctx, err := t.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	rows, err := t.tx.QueryContext(sctx, query, args...)
	t.failed = t.failed || err != nil
	return rows, err
}

// QueryxContext queries in the attempt's transaction, returning sqlx.Rows.
func (t *Tx) QueryxContext(ctx context.Context, query string, args ...any) (*sqlx.Rows, error) {
	sctx, err := t.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	rows, err := t.tx.QueryxContext(sctx, query, args...)
	t.failed = t.failed || err != nil
	return rows, err
}

// QueryRowxContext queries at most one row in the attempt's transaction.
// On a Tx without a database it panics, like a nil *sqlx.Tx, and so it
// does with ErrEndsTransaction for a statement that would end the
// transaction.
func (t *Tx) QueryRowxContext(ctx context.Context, query string, args ...any) *sqlx.Row {
	sctx, err := t.stmt(ctx, query)
	if err != nil {
		panic(err)
	}
	row := t.tx.QueryRowxContext(sctx, query, args...)
	t.failed = t.failed || row.Err() != nil
	return row
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
func (t *Tx) DriverName() string { return t.tx.DriverName() }

// Rebind turns a query's ? placeholders into the driver's bindvars.
func (t *Tx) Rebind(query string) string { return t.tx.Rebind(query) }

// BindNamed binds a query's named parameters from arg (see sqlx.BindNamed).
func (t *Tx) BindNamed(query string, arg any) (string, []any, error) {
	return t.tx.BindNamed(query, arg)
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
	if !ok || t.tx == nil {
		return nil, false
	}
	return t, true
}

// Conn returns the attempt's transaction when ctx carries one, else db:
//
//	_, err := framework.Conn(ctx, r.db).ExecContext(ctx, `INSERT ...`)
func Conn(ctx context.Context, db *sqlx.DB) sqlx.ExtContext {
	if tx, ok := TxFromContext(ctx); ok {
		return tx
	}
	return db
}

// UnitOfWork runs each attempt in a transaction that holds the processed
// mark of the event: the mark and the handler's writes commit together, or
// roll back together. It is the one implementation of the exactly-once
// effect; Consume and the consumer chain both use it.
//
// With a database it commits in groups (unless BatchSize is 1): the
// attempts that arrive while earlier ones commit are gathered into batches
// of up to BatchSize, and a batch runs in one transaction on one
// connection, its attempts one after another, with no savepoint between
// them. When an attempt fails (error, panic, deadline), the transaction
// rolls back: the failed attempt keeps its failure, and the others run
// again, handler included, in a new transaction without it. So a handler
// may run more than once for one delivery; its effect commits once. When
// the commit fails, the attempts that had succeeded run again, each
// alone, before any is charged a failure. Up to Batches batches run at
// once.
type UnitOfWork struct {
	db          *sqlx.DB
	store       Store
	withoutMark bool
	group       *group
}

// Defaults of UnitOfWorkConfig.
const (
	// DefaultBatchSize is the most attempts one transaction holds. A
	// larger batch commits less often, but runs more of its attempts
	// again when one of them fails.
	DefaultBatchSize = 32
	// DefaultBatches is how many batches run at once, each on a
	// connection of its own: one runs its attempts while the other
	// commits.
	DefaultBatches = 2
)

// UnitOfWorkConfig configures a UnitOfWork.
type UnitOfWorkConfig struct {
	// DB is the database of the handler's writes and of the store. Nil is
	// allowed only with memory.Store, and protects one process only.
	DB *sqlx.DB
	// Store keeps the processed marks and the delivery counts that the
	// transaction forgets. Required.
	Store Store
	// BatchSize is the most attempts that commit in one transaction.
	// Defaults to DefaultBatchSize; 1 gives each attempt a transaction of
	// its own, which no other attempt's failure runs again.
	BatchSize int
	// Batches is how many batches run at once. Defaults to
	// DefaultBatches. A batch that could start while another runs waits,
	// unless it fills up, until that one ends, so that under load batches
	// hold many attempts.
	Batches int
	// Linger is how long a batch that could start waits for more
	// attempts while it holds fewer than BatchSize. Zero starts it at
	// once: a batch then holds the attempts that arrived while the
	// previous ones ran, which adds no wait when the load is low.
	Linger time.Duration
	// WithoutMark runs every attempt without the processed mark: the
	// attempt still runs in its transaction, group commit included, but
	// every delivery runs the handler, a redelivery of a processed event
	// too, and Do never returns Duplicate. Only for a consumer whose
	// effect is idempotent by itself (see handlers.WithoutDedup).
	// Defaults to false.
	WithoutMark bool
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c UnitOfWorkConfig) WithDefaults() UnitOfWorkConfig {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Batches = cmp.Or(c.Batches, DefaultBatches)
	return c
}

// Validate reports the first invalid field of c.
func (c UnitOfWorkConfig) Validate() error {
	switch {
	case c.Store == nil:
		return errors.New("UnitOfWorkConfig.Store: required (sqlite.NewStore, postgres.NewStore or memory.NewStore)")
	case c.BatchSize < 1:
		return fmt.Errorf("UnitOfWorkConfig.BatchSize: must be at least 1, got %d", c.BatchSize)
	case c.Batches < 1:
		return fmt.Errorf("UnitOfWorkConfig.Batches: must be at least 1, got %d", c.Batches)
	case c.Linger < 0:
		return fmt.Errorf("UnitOfWorkConfig.Linger: must not be negative, got %s", c.Linger)
	case MarkScopeOf(c.Store) == MarkOutlivesRollback:
		return fmt.Errorf("UnitOfWorkConfig.Store: mark check: processed store %T keeps its marks outside the "+
			"database transaction and keeps them when an attempt fails, so a failed attempt's redelivery would be "+
			"skipped as a duplicate and its effect lost (use a store whose marks join the transaction, such as "+
			"sqlite.Store or postgres.Store, or one that releases them on rollback: see framework.MarkScope)", c.Store)
	}
	return nil
}

// MarkScope says how a Store's processed marks relate to the attempt's
// database transaction, which decides what the exactly-once effect
// survives. A Store declares it with a method MarkScope() MarkScope; a
// Store without one keeps its marks in the transaction, as the Store
// contract asks.
type MarkScope int

// The scopes of a Store's marks.
const (
	// MarkInTx: the mark is a write of the attempt's transaction
	// (sqlite.Store, postgres.Store): it commits with the handler's
	// writes, or rolls back with them, whatever happens to the process.
	MarkInTx MarkScope = iota
	// MarkReleasedOnRollback: the mark is kept outside the database, and
	// released when the attempt's transaction rolls back or fails to
	// commit (Tx.OnRollback), so a failed attempt's redelivery runs the
	// handler again (memory.Store). It cannot join a database's
	// transaction: it does not survive the process, so after a crash or
	// a restart an event delivered again (its ack was lost, the crash
	// came between the commit and the ack) runs its handler again and
	// its effect in the database happens twice; and another process
	// does not see it.
	MarkReleasedOnRollback
	// MarkOutlivesRollback: the mark is kept outside the database and
	// stays when the attempt fails, so the redelivery would be skipped
	// as a duplicate and the effect lost. NewUnitOfWork refuses such a
	// store (the mark check).
	MarkOutlivesRollback
)

// MarkScopeOf returns the scope that s declares (a method MarkScope()
// MarkScope), MarkInTx when it declares none.
func MarkScopeOf(s Store) MarkScope {
	if d, ok := s.(interface{ MarkScope() MarkScope }); ok {
		return d.MarkScope()
	}
	return MarkInTx
}

// NewUnitOfWork returns a UnitOfWork.
func NewUnitOfWork(cfg UnitOfWorkConfig) (*UnitOfWork, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u := &UnitOfWork{db: cfg.DB, store: cfg.Store, withoutMark: cfg.WithoutMark}
	if cfg.DB != nil && cfg.BatchSize > 1 {
		u.group = &group{u: u, size: cfg.BatchSize, linger: cfg.Linger, batches: cfg.Batches, free: cfg.Batches}
	}
	return u, nil
}

// Outcome says what became of a delivery: the unit of work's Do and
// Consume return Processed, Duplicate or Failed; the consumer chain
// reports every outcome, and its metrics carry the outcome's text as a
// label.
type Outcome string

// The outcomes of a delivery.
const (
	// Processed: the handler ran and its effect committed.
	Processed Outcome = "processed"
	// Duplicate: the event had been processed; the handler did not run.
	Duplicate Outcome = "duplicate"
	// Stale: a newer event of the subject had taken effect (skip_stale);
	// the handler did not run.
	Stale Outcome = "stale"
	// Parked: the event waits, acked and not processed, behind an earlier
	// event of its subject that is a dead letter, or that has not arrived
	// (strict order); it is applied once that one takes effect or is
	// discarded.
	Parked Outcome = "parked"
	// DeadLettered: the message was stored as a dead letter and acked.
	DeadLettered Outcome = "dead_lettered"
	// Nacked: the message was handed back to the transport, to be
	// delivered again.
	Nacked Outcome = "nacked"
	// Failed: the attempt rolled back; the event is not processed.
	Failed Outcome = "failed"
)

// Do runs fn once for the event key of consumer: in a transaction (shared
// with other attempts under group commit), it marks the event processed
// and runs fn with a context that carries the transaction (see
// TxFromContext). The effect commits when fn returns nil, and rolls back,
// mark included, when fn fails, panics or ctx ends. When the mark exists,
// fn does not run and Do returns Duplicate. Without the mark
// (UnitOfWorkConfig.WithoutMark), fn runs on every call. Do returns once
// the effect committed or rolled back: a message may be acked then.
func (u *UnitOfWork) Do(ctx context.Context, consumer string, key Key, fn func(ctx context.Context) error) (Outcome, error) {
	a := &attemptRun{ctx: ctx, consumer: consumer, key: key, fn: fn, crash: crash.HookOf(ctx)}
	if u.group == nil {
		u.alone(a)
	} else {
		u.group.run(a)
	}
	if a.panicked != nil {
		panic(a.panicked) // on the attempt's own goroutine, for its chain's recovery
	}
	if a.hookPanicked != nil {
		panic(a.hookPanicked) // a hook's, which ran on the batch's goroutine
	}
	return a.outcome, a.err
}

// attemptRun is one call of Do: its input, and once it ran, its result.
type attemptRun struct {
	ctx      context.Context
	consumer string
	key      Key
	fn       func(ctx context.Context) error

	tx       *Tx
	marked   bool // first holds the mark's result: the batch marked it
	first    bool
	batched  bool              // a.tx is a batch's transaction (group commit)
	ack      *pipeline.AckInTx // the ack the batch writes before its commit
	outcome  Outcome
	err      error
	panicked any
	done     chan struct{}      // closed once the result is set (group commit)
	lead     chan []*attemptRun // hands this attempt a batch to run
	crash    crash.Hook         // the crash hook of ctx, nil without one
	died     crash.Point        // where the attempt died (see dies)

	// hookPanicked is the first panic of one of a's OnCommit or
	// OnRollback hooks, of any run of a: Do panics with it once a's
	// result is set (see Tx.OnCommit).
	hookPanicked any
}

// fail sets a's result to err. An error that came once a's deadline had
// passed is the deadline's too, so that its dead letter says timeout: on
// PostgreSQL the batch's statement_timeout fails a statement that runs
// past it with an error of the server's own (SQLSTATE 57014), which the
// deadline caused.
func (a *attemptRun) fail(err error) {
	if cause := context.Cause(a.ctx); errors.Is(cause, context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w (past the attempt's deadline: %w)", err, cause)
	}
	a.outcome, a.err = Failed, err
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
	a.died, a.outcome, a.err, a.panicked = p, Failed, &crash.Died{At: p}, nil
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
	a.tx, a.marked, a.batched, a.ack = &Tx{}, false, false, nil
	if u.db != nil {
		tx, err := u.db.BeginTxx(a.ctx, nil)
		if err != nil {
			a.fail(fmt.Errorf("begin: %w", err))
			return
		}
		a.tx.tx = tx
	}
	write := u.attempt(a)
	switch {
	case a.died != "" && a.tx.tx != nil:
		// The process died: its transaction ends unfinished, its hooks
		// never run.
		_ = a.tx.tx.Rollback()
	case a.err != nil || a.panicked != nil || !write:
		if a.tx.tx != nil {
			_ = a.tx.tx.Rollback() // the attempt's error is what matters
		}
		a.rolledBack() // without a database, the hooks are the rollback
	case a.tx.tx != nil:
		if err := u.resetSession(a); err != nil {
			_ = a.tx.tx.Rollback() // err is what matters
			a.rolledBack()
			a.fail(err)
			return
		}
		if err := a.tx.tx.Commit(); err != nil {
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
func (u *UnitOfWork) resetSession(a *attemptRun) error {
	if !a.tx.setsSession || u.db.DriverName() != "pgx" {
		return nil
	}
	if _, err := a.tx.tx.ExecContext(a.ctx, "RESET ALL"); err != nil {
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
	a.outcome = Duplicate
	if first {
		a.outcome = Processed
		attemptCtx := pipeline.With(pipeline.With(ctx, tx), attempt{consumer: a.consumer, key: a.key})
		if a.dies(attemptCtx, crash.AfterMark) {
			return false
		}
		if err := a.fn(attemptCtx); err != nil {
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
	} else if !pipeline.Counted(ctx) {
		return false // nothing to write: a duplicate costs the insert that found its mark
	}
	// A processed event, or a duplicate whose delivery was counted (its
	// ack was lost): forget the count, so that lost acks never add up to
	// the delivery limit.
	if pipeline.Counted(ctx) {
		if err := u.store.Forget(ctx, tx, a.consumer, a.key); err != nil {
			a.fail(fmt.Errorf("forget delivery count: %w", err))
			return false
		}
	}
	if ack, ok := pipeline.From[pipeline.AckInTx](ctx); ok && tx.tx != nil && ack.DB == u.db.DB {
		if a.batched && ack.Batch != nil {
			a.ack = &ack // acked with its batch-mates', before the commit (see ackAll)
			return true
		}
		if err := ack.Ack(ctx, tx); err != nil {
			a.fail(fmt.Errorf("ack in transaction: %w", err))
			return false
		}
	}
	return true
}

// callsSetConfig reports whether query names set_config, in any case, as
// a word of its own (not offset_config), without allocating.
func callsSetConfig(query string) bool {
	const name = "set_config"
	for i := 0; i+len(name) <= len(query); i++ {
		if query[i]|0x20 != 's' || !strings.EqualFold(query[i:i+len(name)], name) {
			continue
		}
		if i == 0 || !isIdentByte(query[i-1]) {
			return true
		}
	}
	return false
}

// isIdentByte reports whether b may be part of an SQL identifier.
func isIdentByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b|0x20 >= 'a' && b|0x20 <= 'z' || b >= 0x80
}
