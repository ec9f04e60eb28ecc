package sqlite

import (
	"container/list"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
)

// DefaultStatementCacheSize is how many prepared statements each
// connection of an opened file keeps, by query text.
const DefaultStatementCacheSize = 128

// cachedStmt is a driver statement a connection keeps for its query text.
type cachedStmt struct {
	query string
	stmt  driverStmt
	// busy is set while rows of the statement are open: a statement runs
	// one query at a time, so the same text asked for meanwhile (a query
	// inside the loop over another's rows) is prepared apart.
	busy bool
}

// driverStmt is what modernc.org/sqlite's statement implements and the
// cache uses.
type driverStmt interface {
	driver.Stmt
	driver.StmtExecContext
	driver.StmtQueryContext
}

// stmtCache keeps the statements a connection prepared, by query text, up
// to max of them, dropping the least recently used first. modernc.org/sqlite
// parses and plans a statement each time it is prepared; a kept statement
// is only reset and bound again. SQLite prepares a kept statement again by
// itself when the schema changed under it (sqlite3_prepare_v2), and a
// statement that failed is dropped. Like its connection, a stmtCache is
// used by one goroutine at a time.
type stmtCache struct {
	max   int
	order *list.List // of *cachedStmt, most recently used first
	bySQL map[string]*list.Element
	// prepared counts the statements the cache prepared: what a test looks
	// at to tell a kept statement from a new one.
	prepared int
}

func newStmtCache(size int) *stmtCache {
	return &stmtCache{max: size, order: list.New(), bySQL: make(map[string]*list.Element, size)}
}

// get returns the kept statement of query, preparing and keeping it when
// there is none; nil, with no error, when the kept one is busy.
func (c *stmtCache) get(ctx context.Context, conn driver.ConnPrepareContext, query string) (*cachedStmt, error) {
	if e, ok := c.bySQL[query]; ok {
		cs := e.Value.(*cachedStmt)
		if cs.busy {
			return nil, nil
		}
		c.order.MoveToFront(e)
		return cs, nil
	}
	prepared, err := conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	stmt, ok := prepared.(driverStmt)
	if !ok {
		return nil, errors.Join(fmt.Errorf("sqlite: driver statement %T lacks a method the statement cache needs", prepared), prepared.Close())
	}
	c.prepared++
	cs := &cachedStmt{query: query, stmt: stmt}
	c.bySQL[query] = c.order.PushFront(cs)
	for c.order.Len() > c.max {
		old := c.order.Back()
		oldest := old.Value.(*cachedStmt)
		if oldest.busy {
			// Its rows are open: it closes when they do (see release).
			c.order.Remove(old)
			delete(c.bySQL, oldest.query)
			continue
		}
		_ = c.drop(old) // a statement that fails to close is gone all the same
	}
	return cs, nil
}

// drop forgets the statement of e and closes it.
func (c *stmtCache) drop(e *list.Element) error {
	cs := c.order.Remove(e).(*cachedStmt)
	delete(c.bySQL, cs.query)
	return cs.stmt.Close()
}

// forget drops cs, after it failed, so that its query is prepared again
// next time; a statement already evicted is only closed.
func (c *stmtCache) forget(cs *cachedStmt) {
	if e, ok := c.bySQL[cs.query]; ok && e.Value == cs {
		_ = c.drop(e) // the statement's own failure is what matters
		return
	}
	_ = cs.stmt.Close()
}

// release marks cs free once its rows closed; an evicted cs is closed.
func (c *stmtCache) release(cs *cachedStmt) error {
	cs.busy = false
	if e, ok := c.bySQL[cs.query]; ok && e.Value == cs {
		return nil
	}
	return cs.stmt.Close()
}

// close closes every kept statement.
func (c *stmtCache) close() error {
	var errs []error
	for c.order.Len() > 0 {
		e := c.order.Front()
		if e.Value.(*cachedStmt).busy {
			c.order.Remove(e) // its rows close it
			continue
		}
		errs = append(errs, c.drop(e))
	}
	clear(c.bySQL)
	return errors.Join(errs...)
}

// exec runs query with args on its kept statement; ok is false when the
// statement is busy and the caller runs the query itself.
func (c *stmtCache) exec(ctx context.Context, conn driver.ConnPrepareContext, query string, args []driver.NamedValue) (res driver.Result, ok bool, err error) {
	cs, err := c.get(ctx, conn, query)
	if cs == nil {
		return nil, err != nil, err
	}
	res, err = cs.stmt.ExecContext(ctx, args)
	if err != nil {
		c.forget(cs)
	}
	return res, true, err
}

// query runs query with args on its kept statement, which stays busy
// until the rows close; ok is false when the statement is busy and the
// caller runs the query itself.
func (c *stmtCache) query(ctx context.Context, conn driver.ConnPrepareContext, query string, args []driver.NamedValue) (rows driver.Rows, ok bool, err error) {
	cs, err := c.get(ctx, conn, query)
	if cs == nil {
		return nil, err != nil, err
	}
	r, err := cs.stmt.QueryContext(ctx, args)
	if err != nil {
		c.forget(cs)
		return nil, true, err
	}
	cs.busy = true
	return &cachedRows{Rows: r, cache: c, stmt: cs}, true, nil
}

// cachedRows frees its statement for the next query when it closes.
type cachedRows struct {
	driver.Rows
	cache  *stmtCache
	stmt   *cachedStmt
	closed bool
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	if !r.closed {
		r.closed = true
		err = errors.Join(err, r.cache.release(r.stmt))
	}
	return err
}
