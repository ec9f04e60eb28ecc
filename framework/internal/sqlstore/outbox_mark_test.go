package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/internal/sqlstore"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/internal/testenv"
)

// eachDatabase runs test in a parallel subtest on each database of the
// store tests, migrated, with a context that ends after a minute.
func eachDatabase(t *testing.T, test func(ctx context.Context, t *testing.T, db *sqlx.DB, d sqlstore.Dialect)) {
	t.Parallel()
	for _, b := range []struct {
		name string
		open func(testing.TB) *sqlx.DB
	}{{"SQLite", testenv.SQLite}, {"Postgres", testenv.Postgres}} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			db := b.open(t)
			require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
			d, err := sqlstore.DialectOf(db.DriverName())
			require.NoError(t, err)
			test(ctx, t, db, d)
		})
	}
}

// TestMarkSent: MarkSent stamps the rows of its ids, whatever their
// number, and no other; a row sent already keeps its time. A batch of
// 40,000 ids, more than SQLite binds in a statement, is marked (and
// released) too: it failed every time, so that the relay published its
// rows again at every poll. The ids go as one argument (an array on
// PostgreSQL, a JSON array on SQLite), so that batches of every size
// share one statement: the connection's cache holds one, not one per
// size.
func TestMarkSent(t *testing.T) {
	eachDatabase(t, func(ctx context.Context, t *testing.T, db *sqlx.DB, d sqlstore.Dialect) {
		db.SetMaxOpenConns(1) // one connection: its statement cache below
		for i := range 10 {
			_, err := db.ExecContext(ctx, db.Rebind(`INSERT INTO outbox (event_id, source, type, body, created_at) VALUES (?, 'test', 'test.mark', ?, ?)`),
				fmt.Sprintf("e-%d", i), []byte("{}"), time.Now())
			require.NoError(t, err)
		}
		o, err := sqlstore.NewOutbox(d, "")
		require.NoError(t, err)
		first := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		later := first.Add(time.Hour)
		require.NoError(t, o.MarkSent(ctx, db, []int64{2}, first))
		require.NoError(t, o.MarkSent(ctx, db, []int64{2, 4, 5}, later))
		require.NoError(t, o.MarkSent(ctx, db, []int64{7, 8, 9, 10, 11}, later)) // 11: no such row
		require.NoError(t, o.MarkSent(ctx, db, nil, later))

		sentAt := func(at time.Time) []int64 {
			var ids []int64
			require.NoError(t, db.SelectContext(ctx, &ids, db.Rebind(`SELECT id FROM outbox WHERE sent_at = ? ORDER BY id`), sqlstore.TimeArg(d, at)))
			return ids
		}
		require.Equal(t, []int64{2}, sentAt(first), "a row sent already keeps its time")
		require.Equal(t, []int64{4, 5, 7, 8, 9, 10}, sentAt(later))
		var unsent int
		require.NoError(t, db.GetContext(ctx, &unsent, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`))
		require.Equal(t, 3, unsent)
		// A batch of more ids than SQLite binds in one statement
		// (32,766): the rest of the rows, and ids of none.
		many := make([]int64, 40000)
		for i := range many {
			many[i] = int64(i + 1)
		}
		require.NoError(t, o.Release(ctx, db, many))
		require.NoError(t, o.MarkSent(ctx, db, many, later))
		require.Equal(t, []int64{1, 3, 4, 5, 6, 7, 8, 9, 10}, sentAt(later))
		require.Equal(t, []int64{2}, sentAt(first))

		if d == sqlstore.Postgres {
			var marks int
			require.NoError(t, db.GetContext(ctx, &marks, `SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'UPDATE outbox SET sent_at%'`))
			require.Equal(t, 1, marks, "one statement for batches of 1, 3, 5 and 40,000 ids")
		}
	})
}

// TestIDList: a statement on a list of ids ({in_ids}) runs on more ids
// than SQLite binds in one statement (32,766), on both databases: the
// outbox's marks and releases, the history of purged dead letters.
func TestIDList(t *testing.T) {
	eachDatabase(t, func(ctx context.Context, t *testing.T, db *sqlx.DB, d sqlstore.Dialect) {
		table := "list_" + string(d)
		_, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0)`)
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, `INSERT INTO `+table+` (id) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000) SELECT i FROM n`)
		require.NoError(t, err)
		ids := make([]int64, 0, 40000)
		for i := int64(2); i <= 80000; i += 2 { // the even ones, and 10,000 of none
			ids = append(ids, i)
		}
		require.Greater(t, len(ids), 32766)
		_, err = db.ExecContext(ctx, db.Rebind(sqlstore.WithIDList(d, `UPDATE `+table+` SET v = ? WHERE id {in_ids}`)), 7, sqlstore.IDList(d, ids))
		require.NoError(t, err)
		var set, all int
		require.NoError(t, db.GetContext(ctx, &set, `SELECT count(*) FROM `+table+` WHERE v = 7 AND id % 2 = 0`))
		require.NoError(t, db.GetContext(ctx, &all, `SELECT count(*) FROM `+table+` WHERE v = 7`))
		require.Equal(t, 25000, set)
		require.Equal(t, 25000, all, "no odd id")
	})
}
