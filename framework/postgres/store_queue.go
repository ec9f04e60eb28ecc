package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// Queueable reports whether a statement of an attempt in a batch may wait
// to run with its batch-mates' writes, in one round trip at the next read
// or at the batch's end, instead of a round trip of its own: an INSERT,
// UPDATE, DELETE or MERGE with arguments. A statement without arguments
// runs as it is made (pgx sends it by the simple protocol, which allows
// several statements in one), and so does any other: a SELECT returns at
// once (a lock it takes, pg_sleep), as does a statement with a pgx
// QueryExecMode, which pgx's pipeline does not take.
func (s *Store) Queueable(query string, args []any) bool {
	if len(args) == 0 {
		return false
	}
	if _, ok := args[0].(pgx.QueryExecMode); ok {
		return false
	}
	switch strings.ToUpper(firstWord(query)) {
	case "INSERT", "UPDATE", "DELETE", "MERGE":
		return true
	}
	return false
}

// ExecQueued runs queries, each with its args, in one round trip on conn
// (pgx's pipeline, in conn's transaction), and returns the rows each one
// affected; on a failure, the index of the statement that failed (-1 when
// none did, as when the connection was lost) and its error. PostgreSQL
// skips the statements after a failed one, whose transaction is aborted.
// It runs none unless conn is in an open transaction.
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
			b.Queue(q, plainArgs(args[i])...)
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

// plainArgs returns args as pgx takes them from database/sql, which
// passes a named argument's value alone (pgx's stdlib has no names): the
// caller's slice is copied, not changed, when one is named.
func plainArgs(args []any) []any {
	var plain []any
	for i, a := range args {
		n, ok := a.(sql.NamedArg)
		if !ok {
			continue
		}
		if plain == nil {
			plain = slices.Clone(args)
		}
		plain[i] = n.Value
	}
	if plain == nil {
		return args
	}
	return plain
}

// firstWord returns the first word of a statement, after any blank and
// comment (-- to the line's end, /* */ nested as PostgreSQL nests them).
func firstWord(query string) string {
	i := 0
	for i < len(query) {
		switch {
		case query[i] == ' ' || query[i] == '\t' || query[i] == '\n' || query[i] == '\r' || query[i] == '\f':
			i++
		case strings.HasPrefix(query[i:], "--"):
			end := strings.IndexByte(query[i:], '\n')
			if end < 0 {
				return ""
			}
			i += end + 1
		case strings.HasPrefix(query[i:], "/*"):
			depth := 0
			for i < len(query) {
				if strings.HasPrefix(query[i:], "/*") {
					depth++
					i += 2
				} else if strings.HasPrefix(query[i:], "*/") {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
			if depth != 0 {
				return ""
			}
		default:
			j := i
			for j < len(query) && (query[j] >= 'a' && query[j] <= 'z' || query[j] >= 'A' && query[j] <= 'Z') {
				j++
			}
			return query[i:j]
		}
	}
	return ""
}
