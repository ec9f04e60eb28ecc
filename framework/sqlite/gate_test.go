package sqlite

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

func openGateTestDB(t *testing.T, busy time.Duration) *sqlx.DB {
	t.Helper()
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "gate.db"), OpenConfig{BusyTimeout: busy})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	_, err = db.Exec(`CREATE TABLE counter (n INTEGER NOT NULL); INSERT INTO counter VALUES (0)`)
	require.NoError(t, err)
	return db
}

func TestWriteGate(t *testing.T) {
	t.Parallel()

	t.Run("WritersQueue", func(t *testing.T) {
		t.Parallel()
		// 32 writers whose transactions together take far longer than the
		// busy timeout: queued in order, none gives up. Four connections:
		// three writers at most wait at the gate, each for 150 ms or so,
		// well within the timeout on a busy machine too.
		db := openGateTestDB(t, time.Second)
		db.SetMaxOpenConns(4)
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for range 32 {
			wg.Go(func() {
				tx, err := db.Beginx()
				if err != nil {
					errs <- err
					return
				}
				if _, err := tx.Exec(`UPDATE counter SET n = n + 1`); err != nil {
					_ = tx.Rollback()
					errs <- err
					return
				}
				time.Sleep(50 * time.Millisecond)
				errs <- tx.Commit()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		var n int
		require.NoError(t, db.Get(&n, `SELECT n FROM counter`))
		require.Equal(t, 32, n)
	})

	t.Run("WaitEndsWithContext", func(t *testing.T) {
		t.Parallel()
		db := openGateTestDB(t, time.Minute)
		holder, err := db.Beginx()
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err = db.BeginTxx(ctx, nil)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, holder.Rollback())
		tx, err := db.Beginx()
		require.NoError(t, err, "a rollback opens the gate")
		require.NoError(t, tx.Commit())
	})

	t.Run("BusyTimeout", func(t *testing.T) {
		t.Parallel()
		db := openGateTestDB(t, 50*time.Millisecond)
		holder, err := db.Beginx()
		require.NoError(t, err)
		defer func() { _ = holder.Rollback() }()
		_, err = db.Exec(`UPDATE counter SET n = n + 1`)
		require.True(t, errors.Is(err, errGateTimeout), "an autocommit write waits for the gate too, got %v", err)
		var n int
		require.NoError(t, db.Get(&n, `SELECT n FROM counter`), "reads pass while a writer holds the gate")
	})

	t.Run("ReturningReleasesWithItsRows", func(t *testing.T) {
		t.Parallel()
		db := openGateTestDB(t, 200*time.Millisecond)
		var n int
		require.NoError(t, db.QueryRowx(`UPDATE counter SET n = n + 1 RETURNING n`).Scan(&n))
		require.Equal(t, 1, n)
		tx, err := db.Beginx()
		require.NoError(t, err, "the RETURNING statement released the gate when its rows closed")
		require.NoError(t, tx.Commit())
	})
}

func TestIsRead(t *testing.T) {
	t.Parallel()
	for q, want := range map[string]bool{
		"SELECT 1":                           true,
		"  select * from t":                  true,
		"(SELECT 1)":                         true,
		"INSERT INTO t VALUES (1) RETURNING": false,
		"UPDATE t SET a = 1":                 false,
		"WITH x AS (SELECT 1) DELETE FROM t": false,
		"":                                   false,
	} {
		require.Equal(t, want, isRead(q), q)
	}
}
