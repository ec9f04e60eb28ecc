package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// writeGate queues the write transactions of one process on one file in
// Go, first come first served. Without it they queue in SQLite's busy
// handler, which sleeps and retries: under many concurrent writers (the
// attempts of a consumer with several messages in flight, the claims and
// acks of the transport) a writer can lose the lock again and again, and
// every wait costs a sleep. Writers of other processes still meet in the
// busy handler.
type writeGate struct {
	sem     chan struct{}
	timeout time.Duration
	// checkpoints, when set, checkpoints the file's log after writes.
	checkpoints *checkpointer
}

func newWriteGate(timeout time.Duration) *writeGate {
	return &writeGate{sem: make(chan struct{}, 1), timeout: timeout}
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
	g.unlock()
	if g.checkpoints != nil {
		g.checkpoints.written()
	}
}

// unlock opens the gate after something that wrote nothing to the file.
func (g *writeGate) unlock() { <-g.sem }

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
}

// gatedConnector opens connections whose transactions and writes pass the
// gate.
type gatedConnector struct {
	dsn    string
	driver driver.Driver
	gate   *writeGate
	// stmts is how many statements each connection keeps prepared (see
	// stmtCache); 0 keeps none.
	stmts int
}

func (c *gatedConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.driver.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	sc, ok := conn.(sqliteConn)
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("sqlite: driver connection %T lacks a method the write gate needs", conn)
	}
	gc := &gatedConn{sqliteConn: sc, gate: c.gate}
	if c.stmts > 0 {
		gc.stmts = newStmtCache(c.stmts)
	}
	return gc, nil
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
	gate  *writeGate
	inTx  bool
	stmts *stmtCache // nil: every statement is prepared anew
}

// Close closes the kept statements, then the connection.
func (c *gatedConn) Close() error {
	var err error
	if c.stmts != nil {
		err = c.stmts.close()
	}
	return errors.Join(err, c.sqliteConn.Close())
}

// exec runs query, on its kept statement when it has one free.
func (c *gatedConn) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.stmts != nil {
		if res, ok, err := c.stmts.exec(ctx, c.sqliteConn, query, args); ok {
			return res, err
		}
	}
	return c.sqliteConn.ExecContext(ctx, query, args)
}

// query runs query, on its kept statement when it has one free.
func (c *gatedConn) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.stmts != nil {
		if rows, ok, err := c.stmts.query(ctx, c.sqliteConn, query, args); ok {
			return rows, err
		}
	}
	return c.sqliteConn.QueryContext(ctx, query, args)
}

func (c *gatedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := c.gate.acquire(ctx); err != nil {
		return nil, err
	}
	tx, err := c.sqliteConn.BeginTx(ctx, opts)
	if err != nil {
		c.gate.release()
		return nil, err
	}
	c.inTx = true
	return &gatedTx{Tx: tx, conn: c}, nil
}

func (c *gatedConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *gatedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.inTx {
		return c.exec(ctx, query, args)
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

func (t *gatedTx) Commit() error {
	defer t.end()
	return t.Tx.Commit()
}

func (t *gatedTx) Rollback() error {
	defer t.end()
	return t.Tx.Rollback()
}

func (t *gatedTx) end() {
	t.once.Do(func() {
		t.conn.inTx = false
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
