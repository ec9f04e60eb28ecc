package driver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
)

// execQueuer is a Store whose database can run the statements of a batch
// that return no rows all at once, in one round trip, instead of one
// round trip each (the PostgreSQL store does, through pgx's pipeline).
//
// A batch's attempts then run their writes without waiting for them: an
// ExecContext of a single write (see scanStatements) whose arguments
// QueueArgs accepts returns at once, and the statements
// that wait run, in order, before the next statement that reads (a query,
// a RowsAffected of a waiting statement's result) and before the batch
// ends. If one fails, the batch rolls back and each of its attempts runs
// again alone, its statements each run as it makes them, before any
// attempt is charged: what a handler sees of its statements' errors
// (a unique violation it turns into a code) is always what it would see
// alone.
type execQueuer interface {
	// QueueArgs reports whether a single write with args may wait, and
	// returns the arguments to run it with later: a copy that the
	// caller's changes after ExecContext returned do not reach.
	QueueArgs(args []any) (queued []any, ok bool)
	// ExecQueued runs queries, each with its args, in order, in conn's
	// transaction, and returns the rows each one affected; on a failure,
	// the index of the statement that failed and its error.
	ExecQueued(ctx context.Context, conn *sql.Conn, queries []string, args [][]any) (rows []int64, failed int, err error)
}

// execQueue holds the statements of a batch's attempts that wait to run
// (see execQueuer), on the connection of the batch's transaction.
type execQueue struct {
	store   execQueuer
	conn    *sql.Conn
	ctx     context.Context // the batch's statements' context
	queries []string
	args    [][]any
	results []*queuedResult
	// err is the error of the statements that ran last, once one failed:
	// the batch's transaction is aborted, and every flush after it
	// fails with err. failedBy is the attempt whose statement failed.
	err      error
	failedBy *Tx
}

// queuedResult is the result of a statement that waits in an execQueue.
type queuedResult struct {
	q    *execQueue
	by   *Tx
	rows int64
}

// RowsAffected runs the statements that wait, this one's among them, and
// returns the rows this one affected.
func (r *queuedResult) RowsAffected() (int64, error) {
	if err := r.q.flush(); err != nil {
		return 0, err
	}
	return r.rows, nil
}

// LastInsertId fails, as it does on pgx: PostgreSQL has no last insert id
// (use RETURNING).
func (r *queuedResult) LastInsertId() (int64, error) {
	return 0, errors.New("LastInsertId is not supported by this driver")
}

// add queues query with args for the attempt of t, and returns its result.
func (q *execQueue) add(t *Tx, query string, args []any) sql.Result {
	r := &queuedResult{q: q, by: t}
	q.queries = append(q.queries, query)
	q.args = append(q.args, args)
	q.results = append(q.results, r)
	return r
}

// flush runs the statements that wait, and returns the error of the one
// that failed, now or at an earlier flush.
func (q *execQueue) flush() error {
	if q.err != nil || len(q.queries) == 0 {
		return q.err
	}
	rows, failed, err := q.store.ExecQueued(q.ctx, q.conn, q.queries, q.args)
	if err != nil {
		q.err = fmt.Errorf("the batch's queued statements: %w", err)
		if failed >= 0 && failed < len(q.results) {
			q.failedBy = q.results[failed].by
		}
	} else {
		for i, r := range q.results {
			r.rows = rows[i]
		}
	}
	clear(q.args) // no argument outlives its statement
	q.queries, q.args, q.results = q.queries[:0], q.args[:0], q.results[:0]
	return q.err
}

// begin begins a batch's transaction, on a connection of its own when the
// store can queue the batch's writes (see execQueuer): queue is then the
// batch's, and its connection is to be closed once the transaction ended.
func (g *group) begin(ctx context.Context) (tx *sqlx.Tx, queue *execQueue, err error) {
	q, ok := g.u.store.(execQueuer)
	if !ok || g.u.db.DriverName() != "pgx" {
		tx, err = g.u.db.BeginTxx(ctx, nil)
		return tx, nil, err
	}
	conn, err := g.u.db.Connx(ctx)
	if err != nil {
		return nil, nil, err
	}
	tx, err = conn.BeginTxx(ctx, nil)
	if err != nil {
		_ = conn.Close() // err is what matters
		return nil, nil, err
	}
	return tx, &execQueue{store: q, conn: conn.Conn}, nil
}

// queueFailed returns retry, the attempts of a batch whose queued
// statements failed that run again alone, but for the attempt whose
// statement failed once its deadline passed: that one fails with the
// statement's error (a statement_timeout at its deadline), since it
// could only fail alone at its begin. The deadline is read from the
// clock, not from the context, whose timer a loaded machine runs late.
func queueFailed(queue *execQueue, retry []*attemptRun) []*attemptRun {
	if queue == nil || queue.failedBy == nil {
		return retry
	}
	for i, a := range retry {
		if a.tx == queue.failedBy && pastDeadline(a.ctx) {
			a.fail(queue.err)
			return slices.Delete(retry, i, i+1)
		}
	}
	return retry
}

// pastDeadline reports whether ctx ended, or its deadline passed.
func pastDeadline(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(d)
}
