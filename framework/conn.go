package framework

import (
	"context"
	"errors"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// Conn returns the attempt's transaction when ctx carries one, else db:
//
//	_, err := framework.Conn(ctx, r.db).ExecContext(ctx, `INSERT ...`)
func Conn(ctx context.Context, db *sqlx.DB) sqlx.ExtContext {
	if a, ok := pipeline.From[pipeline.Attempt](ctx); ok && a.Conn != nil {
		return a.Conn
	}
	return db
}

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
