package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// stmtTestConn is one connection of a file opened with a statement cache
// of size, with a table t (k, v) of three rows.
func stmtTestConn(t *testing.T, size int) *sql.Conn {
	t.Helper()
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "stmts.db"), OpenConfig{StatementCacheSize: size})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	_, err = conn.ExecContext(ctx, `CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)`)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `INSERT INTO t (k, v) VALUES (1, 'a'), (2, 'b'), (3, 'c')`)
	require.NoError(t, err)
	return conn
}

// cacheOf returns the statement cache of conn's driver connection.
func cacheOf(t *testing.T, conn *sql.Conn) (kept, prepared int) {
	t.Helper()
	require.NoError(t, conn.Raw(func(dc any) error {
		c := dc.(*gatedConn).stmts
		if c != nil {
			kept, prepared = c.order.Len(), c.prepared
		}
		return nil
	}))
	return kept, prepared
}

func TestStatementCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const read = `SELECT v FROM t WHERE k = ?`

	t.Run("PreparesAStatementOnce", func(t *testing.T) {
		t.Parallel()
		conn := stmtTestConn(t, 0)
		_, before := cacheOf(t, conn)
		for i := range 10 {
			tx, err := conn.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, `UPDATE t SET v = ? WHERE k = 1`, fmt.Sprint("x", i))
			require.NoError(t, err)
			var v string
			require.NoError(t, tx.QueryRowContext(ctx, read, 1).Scan(&v))
			require.Equal(t, fmt.Sprint("x", i), v, "a kept statement sees its transaction's writes")
			require.NoError(t, tx.Commit())
		}
		_, after := cacheOf(t, conn)
		require.Equal(t, 2, after-before, "two texts, run ten times each across ten transactions")
	})

	t.Run("BoundedLeastRecentlyUsedFirst", func(t *testing.T) {
		t.Parallel()
		conn := stmtTestConn(t, 4)
		for i := range 20 { // texts that vary, as an IN list by batch size does
			_, err := conn.ExecContext(ctx, fmt.Sprintf(`UPDATE t SET v = v WHERE k < %d`, i))
			require.NoError(t, err)
		}
		kept, _ := cacheOf(t, conn)
		require.Equal(t, 4, kept)
		_, before := cacheOf(t, conn)
		_, err := conn.ExecContext(ctx, `UPDATE t SET v = v WHERE k < 19`) // most recent: kept
		require.NoError(t, err)
		_, mid := cacheOf(t, conn)
		require.Equal(t, before, mid)
		_, err = conn.ExecContext(ctx, `UPDATE t SET v = v WHERE k < 0`) // evicted long ago
		require.NoError(t, err)
		_, after := cacheOf(t, conn)
		require.Equal(t, before+1, after)
	})

	t.Run("SameTextWhileRowsAreOpen", func(t *testing.T) {
		t.Parallel()
		conn := stmtTestConn(t, 0)
		const all = `SELECT k, v FROM t WHERE k >= ? ORDER BY k`
		outer, err := conn.QueryContext(ctx, all, 1)
		require.NoError(t, err)
		var got []string
		for outer.Next() {
			var k int
			var v string
			require.NoError(t, outer.Scan(&k, &v))
			// The same text inside the loop over its rows: it must not
			// reset the statement the outer rows read.
			inner, err := conn.QueryContext(ctx, all, k)
			require.NoError(t, err)
			n := 0
			for inner.Next() {
				n++
			}
			require.NoError(t, inner.Close())
			got = append(got, fmt.Sprint(v, n))
		}
		require.NoError(t, outer.Err())
		require.NoError(t, outer.Close())
		require.Equal(t, []string{"a3", "b2", "c1"}, got)
	})

	t.Run("SchemaChange", func(t *testing.T) {
		t.Parallel()
		conn := stmtTestConn(t, 0)
		const all = `SELECT * FROM t ORDER BY k`
		cols := func() []string {
			rows, err := conn.QueryContext(ctx, all)
			require.NoError(t, err)
			defer func() { require.NoError(t, rows.Close()) }()
			c, err := rows.Columns()
			require.NoError(t, err)
			return c
		}
		require.Equal(t, []string{"k", "v"}, cols())
		_, err := conn.ExecContext(ctx, `DROP TABLE t`)
		require.NoError(t, err)
		_, err = conn.QueryContext(ctx, all)
		require.ErrorContains(t, err, "no such table")
		_, err = conn.ExecContext(ctx, `CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT, w TEXT)`)
		require.NoError(t, err)
		require.Equal(t, []string{"k", "v", "w"}, cols())
	})

	t.Run("FailedStatementIsDropped", func(t *testing.T) {
		t.Parallel()
		conn := stmtTestConn(t, 0)
		const insert = `INSERT INTO t (k, v) VALUES (?, 'd')`
		_, err := conn.ExecContext(ctx, insert, 1)
		require.ErrorContains(t, err, "UNIQUE")
		kept, before := cacheOf(t, conn)
		_, err = conn.ExecContext(ctx, insert, 4)
		require.NoError(t, err)
		keptAfter, after := cacheOf(t, conn)
		require.Equal(t, before+1, after, "prepared again after its failure")
		require.Equal(t, kept+1, keptAfter)
	})

	t.Run("Off", func(t *testing.T) {
		t.Parallel()
		conn := stmtTestConn(t, -1)
		var v string
		require.NoError(t, conn.QueryRowContext(ctx, read, 2).Scan(&v))
		require.Equal(t, "b", v)
		kept, prepared := cacheOf(t, conn)
		require.Zero(t, kept+prepared)
	})
}
