package postgres

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// QueueArgs reports whether a single write (an INSERT, UPDATE, DELETE or
// MERGE, as the unit of work reads it) of an attempt in a batch with args
// may wait to run with its batch-mates' writes, in one round trip at the
// next read or at the batch's end, instead of a round trip of its own,
// and returns the arguments to run it with: a copy that the caller's
// later changes do not reach, since it runs after ExecContext returned.
// It may wait when it has arguments, each of them a value that a copy
// holds: nil, a string, a bool, a number, a time.Time, a time.Duration, a
// database/sql Null type, a []byte or json.RawMessage (copied), or a
// sql.NamedArg of one (its value alone, as pgx's stdlib takes it). It
// runs as it is made without arguments (pgx sends such a statement by
// the simple protocol, which allows several in one), and with an
// argument a copy might not hold (a pointer, a map, a slice, a value of
// the caller's type, a pgx QueryExecMode or NamedArgs).
func (s *Store) QueueArgs(args []any) (queued []any, ok bool) {
	if len(args) == 0 {
		return nil, false
	}
	queued = make([]any, len(args))
	for i, a := range args {
		if queued[i], ok = heldValue(a); !ok {
			return nil, false
		}
	}
	return queued, true
}

// heldValue returns a copy of an argument that its caller's later changes
// do not reach, and false for one of a type a copy might not hold (see
// Store.QueueArgs).
func heldValue(a any) (any, bool) {
	switch v := a.(type) {
	case nil, string, bool, time.Time, time.Duration,
		int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64,
		sql.NullString, sql.NullBool, sql.NullByte, sql.NullInt16, sql.NullInt32, sql.NullInt64,
		sql.NullFloat64, sql.NullTime:
		return v, true
	case []byte:
		return bytes.Clone(v), true
	case json.RawMessage:
		return json.RawMessage(bytes.Clone(v)), true
	case sql.NamedArg:
		return heldValue(v.Value)
	}
	return nil, false
}

// ExecQueued runs queries, each with its args (as QueueArgs returned
// them), in one round trip on conn (pgx's pipeline, in conn's
// transaction), and returns the rows each one affected; on a failure, its
// error and the index of the statement whose result carried it (-1 when
// none was sent). PostgreSQL skips the statements after a failed one,
// whose transaction is aborted. It sends none unless conn is in an open
// transaction.
func (s *Store) ExecQueued(ctx context.Context, conn *sql.Conn, queries []string, args [][]any) (rows []int64, failed int, err error) {
	failed = -1
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("queued statements: the connection is a %T, not pgx's", dc)
		}
		// database/sql rolls a transaction back when its context ends,
		// on its own goroutine, and no statement of its Tx runs after:
		// these do not go through it, so they check, holding the
		// connection, that its transaction is open. Outside one, each
		// would commit on its own, without the batch's marks.
		if status := c.Conn().PgConn().TxStatus(); status != 'T' {
			return fmt.Errorf("queued statements: the connection has no open transaction (status %q)", status)
		}
		var b pgx.Batch
		for i, q := range queries {
			b.Queue(q, args[i]...)
		}
		br := c.Conn().SendBatch(ctx, &b)
		rows = make([]int64, len(queries))
		for i := range queries {
			tag, err := br.Exec()
			if err != nil {
				failed = i
				_ = br.Close() // err is what matters
				return err
			}
			rows[i] = tag.RowsAffected()
		}
		return br.Close()
	})
	return rows, failed, err
}
