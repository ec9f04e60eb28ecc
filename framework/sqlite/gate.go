package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sqlitedriver "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// writeGate queues the write transactions of one process on one file in
// Go, first come first served. Without it they queue in SQLite's busy
// handler, which sleeps and retries: under many concurrent writers (the
// attempts of a consumer with several messages in flight, the claims and
// acks of the transport) a writer can lose the lock again and again, and
// every wait costs a sleep. A transaction that meets a writer of another
// process tries again in steps of its own (see gatedConn.begin); the
// other statements still meet such writers in the busy handler.
type writeGate struct {
	sem chan struct{}
	// waiting counts the writers blocked in acquire (see handOff).
	waiting atomic.Int32
	timeout time.Duration
	// busyTimeout is the PRAGMA that sets a connection's busy timeout to
	// timeout (see gatedConn.begin).
	busyTimeout string
	// checkpoints, when set, checkpoints the file's log after writes.
	checkpoints *checkpointer
}

func newWriteGate(timeout time.Duration) *writeGate {
	return &writeGate{
		sem: make(chan struct{}, 1), timeout: timeout,
		busyTimeout: "PRAGMA busy_timeout = " + strconv.FormatInt(timeout.Milliseconds(), 10),
	}
}

// errGateTimeout is what a writer gets when the gate stays closed for the
// busy timeout, as SQLite's own SQLITE_BUSY would say.
var errGateTimeout = errors.New("database is locked: waited for the write lock longer than the busy timeout")

func (g *writeGate) acquire(ctx context.Context) error {
	select {
	case g.sem <- struct{}{}:
		return nil
	default:
	}
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	timer := time.NewTimer(g.timeout)
	defer timer.Stop()
	select {
	case g.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return errGateTimeout
	}
}

// release ends a write: the gate opens and the file's checkpoints learn
// of the write.
func (g *writeGate) release() {
	<-g.sem
	if g.checkpoints != nil {
		g.checkpoints.written()
	}
	g.handOff()
}

// unlock opens the gate after something that wrote nothing to the file.
func (g *writeGate) unlock() {
	<-g.sem
	g.handOff()
}

// handOff yields the processor to the writer that the gate just let in,
// if one waited, as sync.Mutex hands itself off when starved. The file
// has one writer at a time, and it bounds what a busy process commits:
// the writer let in is woken on this processor, where, without the
// yield, the goroutines that the one leaving wakes next (a batch's
// attempts, told their results) would each be run before it, the lock
// held by no one running. With this yield and the batches' own
// (framework's group.ended), SQLite's example service drained about 5%
// faster on average in ten interleaved pairs of drains (see
// docs/benchmarks.md).
func (g *writeGate) handOff() {
	if g.waiting.Load() > 0 {
		runtime.Gosched()
	}
}

// sqliteConn is what modernc.org/sqlite's connection implements and the
// gate forwards.
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
	// RegisterRollbackHook sets what SQLite calls whenever a transaction
	// rolls back, by a ROLLBACK or on its own after a failed statement.
	RegisterRollbackHook(sqlitedriver.RollbackHookFn)
}

// ErrRolledBack is returned by a statement of a transaction that SQLite
// rolled back on its own after a statement failed, and by its Commit.
// SQLite ends the whole transaction on some failures, for example
// SQLITE_FULL, SQLITE_IOERR, SQLITE_NOMEM, an interrupt or a conflict
// clause OR ROLLBACK, even while rows are read; the statements after
// would each run and commit alone, outside any transaction. They fail
// instead, until the transaction's Rollback, as on PostgreSQL after a
// failed statement: the error's SQLState is 25P02
// (in_failed_sql_transaction).
var ErrRolledBack error = rolledBack{}

type rolledBack struct{}

func (rolledBack) Error() string {
	return "sqlite: the transaction was rolled back by SQLite after a statement failed; statements are refused until it ends"
}

// SQLState returns PostgreSQL's code of the same refusal, which the
// framework's group commit knows.
func (rolledBack) SQLState() string { return "25P02" }

// gatedConnector opens connections whose transactions and writes pass the
// gate.
type gatedConnector struct {
	// dsn opens the first connection, which creates the file when it is
	// missing; existing opens the ones after, which never do (see open).
	dsn, existing string
	driver        driver.Driver
	gate          *writeGate
	// stmts is how many statements each connection keeps prepared (see
	// stmtCache); 0 keeps none.
	stmts int
	// identity is the file the first connection opened, nil for an
	// in-memory database: a connection is neither opened nor pinged nor
	// begun on another file.
	identity *fileIdentity
}

func (c *gatedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	// Before the driver opens it: no connection to a file gone or replaced.
	if err := c.identity.checkNow(); err != nil {
		return nil, err
	}
	conn, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	c.identity.remember()
	sc, ok := conn.(sqliteConn)
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("sqlite: driver connection %T lacks a method the write gate needs", conn)
	}
	gc := &gatedConn{sqliteConn: sc, gate: c.gate, identity: c.identity}
	sc.RegisterRollbackHook(gc.rolledBack)
	if c.stmts > 0 {
		gc.stmts = newStmtCache(c.stmts)
	}
	return gc, nil
}

// open opens a connection of the driver, trying again at the steps of
// beginRetries for up to the busy timeout while the file is locked. The
// connection runs the DSN's pragmas as it opens, and the connection that
// switches a new file to write-ahead logging holds the file's exclusive
// lock while it does: SQLite answers another connection's journal_mode
// pragma meanwhile with SQLITE_BUSY at once, without its busy handler, so
// a service and a command opening a new file together failed to start.
//
// Once the file is known (fileIdentity.known), a connection opens it only
// if it is there (the existing DSN, mode=rw), and the file is looked at
// again after the open: the look before it (Connect's, the
// checkpointer's) and the open are two steps, and a file deleted between
// them was created again, empty, by the open, which the next look took
// for a file put in its place. TestOpenFileGone saw "was replaced" for a
// deleted file about once in 36 runs, when the checkpointer's first
// connection opened as the test deleted the file.
func (c *gatedConnector) open(ctx context.Context) (driver.Conn, error) {
	if !c.identity.known() {
		return c.openDSN(ctx, c.dsn)
	}
	conn, err := c.openDSN(ctx, c.existing)
	if gone := c.identity.checkNow(); gone != nil {
		if conn != nil {
			_ = conn.Close()
		}
		return nil, errors.Join(gone, err)
	}
	return conn, err
}

// openDSN is open with the DSN dsn.
func (c *gatedConnector) openDSN(ctx context.Context, dsn string) (driver.Conn, error) {
	deadline := time.Now().Add(c.gate.timeout)
	for i := 0; ; i++ {
		conn, err := c.driver.Open(dsn)
		if err == nil || !isBusy(err) || !time.Now().Before(deadline) {
			return conn, err
		}
		select {
		case <-time.After(beginRetries[min(i, len(beginRetries)-1)]):
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		}
	}
}

func (c *gatedConnector) Driver() driver.Driver { return c.driver }

// Close stops the file's checkpoints; database/sql calls it when the
// database closes, after its connections.
func (c *gatedConnector) Close() error {
	if c.gate.checkpoints == nil {
		return nil
	}
	return c.gate.checkpoints.Close()
}

// gatedConn holds the gate from BeginTx to Commit or Rollback, and around
// each statement outside a transaction that may write. It runs the
// statements it is given on the ones its cache keeps prepared.
type gatedConn struct {
	sqliteConn
	gate *writeGate
	inTx bool
	// lost is set once SQLite rolled the transaction back, until it ends
	// (see ErrRolledBack).
	lost  bool
	stmts *stmtCache // nil: every statement is prepared anew
	// identity is the connector's: set for a file, which other processes
	// may write too; nil for an in-memory database.
	identity *fileIdentity
}

// Ping fails once the file is gone or replaced, which is what readiness
// checks ask.
func (c *gatedConn) Ping(ctx context.Context) error {
	if err := c.identity.checkNow(); err != nil {
		return err
	}
	return c.sqliteConn.Ping(ctx)
}

// Close closes the kept statements, then the connection.
func (c *gatedConn) Close() error {
	var err error
	if c.stmts != nil {
		err = c.stmts.close()
	}
	return errors.Join(err, c.sqliteConn.Close())
}

// rolledBack is the connection's rollback hook: SQLite runs it on the
// goroutine whose statement rolled the transaction back. Within Commit
// and Rollback it sets lost too, which end then clears.
func (c *gatedConn) rolledBack() {
	c.lost = c.inTx
}

// exec runs query, on its kept statement when it has one free.
func (c *gatedConn) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.lost {
		return nil, ErrRolledBack
	}
	if c.stmts != nil {
		if res, ok, err := c.stmts.exec(ctx, c.sqliteConn, query, args); ok {
			return res, err
		}
	}
	return c.sqliteConn.ExecContext(ctx, query, args)
}

// query runs query, on its kept statement when it has one free.
func (c *gatedConn) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.lost {
		return nil, ErrRolledBack
	}
	if c.stmts != nil {
		if rows, ok, err := c.stmts.query(ctx, c.sqliteConn, query, args); ok {
			return rows, err
		}
	}
	return c.sqliteConn.QueryContext(ctx, query, args)
}

func (c *gatedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	// A transaction on a deleted file would commit into nothing.
	if err := c.identity.check(); err != nil {
		return nil, err
	}
	if err := c.gate.acquire(ctx); err != nil {
		return nil, err
	}
	tx, err := c.begin(ctx, opts)
	if err != nil {
		c.gate.release()
		return nil, err
	}
	c.inTx = true
	return &gatedTx{Tx: tx, conn: c}, nil
}

// beginRetries is how long a BEGIN waits before it tries again while a
// writer of another process holds the file's write lock: steps that grow
// to a millisecond, which repeats.
var beginRetries = [...]time.Duration{20 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond, time.Millisecond}

// begin begins a transaction on a file, waiting up to the busy timeout
// for a writer of another process to let go of the write lock. SQLite's
// own busy handler would sleep 1, 2, then 5 ms and more between tries,
// while this process's writers queue behind the one that sleeps: with a
// producer in another process committing thousands of short transactions
// a second, those sleeps were most of the consumer's time (p50 of 200 to
// 500 ms at half its drain rate in make bench; 30 ms with this). So the
// BEGIN runs with the handler off (PRAGMA busy_timeout = 0), tries again
// at the steps of beginRetries, and the connection's busy timeout is set
// back (writeGate.busyTimeout) before the transaction is handed out:
// every other statement waits as before. The PRAGMAs are prepared each
// time, not kept: SQLite applies busy_timeout when it prepares the
// statement.
func (c *gatedConn) begin(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.identity == nil { // in memory: no other process writes it
		return c.sqliteConn.BeginTx(ctx, opts)
	}
	if _, err := c.sqliteConn.ExecContext(ctx, "PRAGMA busy_timeout = 0", nil); err != nil {
		return nil, fmt.Errorf("sqlite: begin: %w", err)
	}
	restore := func() error {
		if _, err := c.sqliteConn.ExecContext(context.WithoutCancel(ctx), c.gate.busyTimeout, nil); err != nil {
			return fmt.Errorf("sqlite: begin: restore the busy timeout: %w", err)
		}
		return nil
	}
	deadline := time.Now().Add(c.gate.timeout)
	var wait *time.Timer
	for i := 0; ; i++ {
		tx, err := c.sqliteConn.BeginTx(ctx, opts)
		if err == nil {
			if err := restore(); err != nil {
				return nil, errors.Join(err, tx.Rollback())
			}
			return tx, nil
		}
		if !isBusy(err) || !time.Now().Before(deadline) {
			return nil, errors.Join(err, restore())
		}
		d := beginRetries[min(i, len(beginRetries)-1)]
		if wait == nil {
			wait = time.NewTimer(d)
			defer wait.Stop()
		} else {
			wait.Reset(d)
		}
		select {
		case <-wait.C:
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), restore())
		}
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY (any of its extended
// codes): the lock was held by another connection.
func isBusy(err error) bool {
	var e *sqlitedriver.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_BUSY
}

func (c *gatedConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *gatedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.inTx {
		return c.exec(ctx, query, args)
	}
	if err := c.identity.check(); err != nil {
		return nil, err
	}
	if err := c.gate.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.gate.release()
	return c.exec(ctx, query, args)
}

func (c *gatedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.inTx || isRead(query) {
		return c.query(ctx, query, args)
	}
	if err := c.identity.check(); err != nil {
		return nil, err
	}
	// A write that returns rows (INSERT ... RETURNING) holds the gate
	// until its rows are read, when SQLite finishes the statement.
	if err := c.gate.acquire(ctx); err != nil {
		return nil, err
	}
	rows, err := c.query(ctx, query, args)
	if err != nil {
		c.gate.release()
		return nil, err
	}
	return &gatedRows{Rows: rows, gate: c.gate}, nil
}

// isRead reports whether query only reads (a SELECT): under WAL readers
// need no lock. Anything else is taken as a possible write; gating a read
// costs only a wait.
func isRead(query string) bool {
	q := strings.TrimLeft(query, " \t\r\n(")
	return len(q) >= 6 && strings.EqualFold(q[:6], "SELECT")
}

type gatedTx struct {
	driver.Tx
	conn *gatedConn
	once sync.Once
}

// Commit commits, unless SQLite rolled the transaction back already:
// then it fails with ErrRolledBack.
func (t *gatedTx) Commit() error {
	defer t.end()
	if t.conn.lost {
		_ = t.Tx.Rollback() // fails, as SQLite ended it; see Rollback
		return ErrRolledBack
	}
	return t.Tx.Commit()
}

// Rollback rolls back. When SQLite did already, the ROLLBACK fails (no
// transaction is active) and Rollback returns nil; it is run all the
// same, so that the connection never stays in a transaction.
func (t *gatedTx) Rollback() error {
	defer t.end()
	lost := t.conn.lost
	if err := t.Tx.Rollback(); err != nil && !lost {
		return err
	}
	return nil
}

func (t *gatedTx) end() {
	t.once.Do(func() {
		t.conn.inTx, t.conn.lost = false, false
		t.conn.gate.release()
	})
}

type gatedRows struct {
	driver.Rows
	gate *writeGate
	once sync.Once
}

func (r *gatedRows) Close() error {
	defer r.once.Do(r.gate.release)
	return r.Rows.Close()
}
