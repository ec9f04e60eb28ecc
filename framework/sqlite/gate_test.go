package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
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

	t.Run("CountsItsWaiters", func(t *testing.T) {
		t.Parallel()
		// The gate yields to the writer it lets in only while one waits
		// (handOff): a waiter that got in, gave up or timed out is no
		// longer counted, so releases with nobody waiting never yield.
		g := newWriteGate(100 * time.Millisecond)
		ctx := context.Background()
		require.NoError(t, g.acquire(ctx))
		require.Zero(t, g.waiting.Load(), "an open gate is taken without waiting")

		got := make(chan error, 1)
		go func() { got <- g.acquire(ctx) }()
		require.Eventually(t, func() bool { return g.waiting.Load() == 1 }, 5*time.Second, time.Millisecond)
		g.release()
		require.NoError(t, <-got)
		require.Zero(t, g.waiting.Load(), "the waiter let in")

		cancelled, cancel := context.WithCancel(ctx)
		go func() { got <- g.acquire(cancelled) }()
		require.Eventually(t, func() bool { return g.waiting.Load() == 1 }, 5*time.Second, time.Millisecond)
		cancel()
		require.ErrorIs(t, <-got, context.Canceled)
		require.Zero(t, g.waiting.Load(), "the waiter that gave up")

		require.ErrorIs(t, g.acquire(ctx), errGateTimeout)
		require.Zero(t, g.waiting.Load(), "the waiter that timed out")
		g.unlock()
		require.NoError(t, g.acquire(ctx), "the gate opened")
		g.unlock()
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

// foreignWriter holds the write lock of the file at path as a writer of
// another process would: a connection of its own, outside the gate, in
// BEGIN IMMEDIATE. It returns the commit that lets go of it.
func foreignWriter(t *testing.T, path string) func() {
	t.Helper()
	ctx := context.Background()
	foreign, err := sql.Open(DriverName, path+"?_pragma=busy_timeout(10000)") // its BEGIN waits out a checkpoint
	require.NoError(t, err)
	t.Cleanup(func() { _ = foreign.Close() })
	conn, err := foreign.Conn(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `BEGIN IMMEDIATE`)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `UPDATE counter SET n = n + 1`)
	require.NoError(t, err)
	return func() {
		_, err := conn.ExecContext(ctx, `COMMIT`)
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	}
}

// busyTimeout reads the busy timeout of the one connection of db, in ms.
func busyTimeout(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var ms int
	require.NoError(t, db.Get(&ms, `PRAGMA busy_timeout`))
	return ms
}

// TestBeginAgainstAnotherProcess shows a BEGIN meeting a writer of
// another process, which SQLite's busy handler would make sleep for
// milliseconds at a time: it tries again at finer steps, succeeds once
// the other writer commits, gives up after the busy timeout or when its
// context ends, and leaves the connection's busy timeout as it was.
func TestBeginAgainstAnotherProcess(t *testing.T) {
	t.Parallel()
	open := func(t *testing.T, busy time.Duration) (*sqlx.DB, string) {
		path := filepath.Join(t.TempDir(), "gate.db")
		db, err := Open(context.Background(), path, OpenConfig{BusyTimeout: busy})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		db.SetMaxOpenConns(1) // one connection: the one whose busy timeout is read
		_, err = db.Exec(`CREATE TABLE counter (n INTEGER NOT NULL); INSERT INTO counter VALUES (0)`)
		require.NoError(t, err)
		return db, path
	}

	t.Run("WaitsForItsCommit", func(t *testing.T) {
		t.Parallel()
		db, path := open(t, 10*time.Second)
		commit := foreignWriter(t, path)
		var committed atomic.Bool
		began := make(chan error, 1)
		go func() {
			tx, err := db.Beginx()
			if err == nil {
				if !committed.Load() {
					err = errors.New("began while the other process held the write lock")
				}
				_, uerr := tx.Exec(`UPDATE counter SET n = n + 1`)
				err = errors.Join(err, uerr, tx.Commit())
			}
			began <- err
		}()
		time.Sleep(100 * time.Millisecond) // let the BEGIN meet the lock
		committed.Store(true)
		commit()
		require.NoError(t, <-began)
		var n int
		require.NoError(t, db.Get(&n, `SELECT n FROM counter`))
		require.Equal(t, 2, n, "both writes committed")
		require.Equal(t, 10000, busyTimeout(t, db), "the connection's busy timeout is back")
	})

	t.Run("GivesUpAfterTheBusyTimeout", func(t *testing.T) {
		t.Parallel()
		db, path := open(t, 200*time.Millisecond)
		commit := foreignWriter(t, path)
		_, err := db.Beginx()
		require.Error(t, err)
		require.True(t, isBusy(err), "SQLite's own error, as its busy handler would give it: %v", err)
		commit()
		require.Equal(t, 200, busyTimeout(t, db), "the connection's busy timeout is back")
		tx, err := db.Beginx()
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	})

	t.Run("EndsWithItsContext", func(t *testing.T) {
		t.Parallel()
		db, path := open(t, time.Minute)
		commit := foreignWriter(t, path)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := db.BeginTxx(ctx, nil)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		commit()
		require.Equal(t, 60000, busyTimeout(t, db), "the connection's busy timeout is back")
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

// TestRolledBackBySQLite: once SQLite rolled a transaction back on its
// own after a failed statement (here the conflict clause OR ROLLBACK),
// the transaction's statements fail instead of each running and
// committing alone, its Commit fails, its Rollback succeeds, and the
// connection begins afresh after it. A savepoint's ROLLBACK TO, or a
// statement that fails alone, ends nothing.
func TestRolledBackBySQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openGateTestDB(t, time.Second)
	db.SetMaxOpenConns(1)
	_, err := db.Exec(`CREATE TABLE t (id TEXT PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO t VALUES ('taken')`)
	require.NoError(t, err)
	ids := func() []string {
		t.Helper()
		var got []string
		require.NoError(t, db.Select(&got, `SELECT id FROM t ORDER BY id`))
		return got
	}

	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.Exec(`INSERT INTO t VALUES ('before')`)
	require.NoError(t, err)
	_, err = tx.Exec(`INSERT OR ROLLBACK INTO t VALUES ('taken')`)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrRolledBack, "the statement that failed says why")
	_, err = tx.Exec(`INSERT INTO t VALUES ('after')`)
	require.ErrorIs(t, err, ErrRolledBack)
	var s interface{ SQLState() string }
	require.ErrorAs(t, err, &s)
	require.Equal(t, "25P02", s.SQLState())
	_, err = tx.Query(`SELECT id FROM t`)
	require.ErrorIs(t, err, ErrRolledBack)
	require.ErrorIs(t, tx.Commit(), ErrRolledBack)
	require.Equal(t, []string{"taken"}, ids(), "nothing of the transaction, nor after it, was written")

	tx, err = db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.Exec(`INSERT OR ROLLBACK INTO t VALUES ('taken')`)
	require.Error(t, err)
	require.NoError(t, tx.Rollback(), "a rollback of what SQLite rolled back")

	tx, err = db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	for _, q := range []string{`SAVEPOINT s`, `INSERT INTO t VALUES ('undone')`, `ROLLBACK TO s`, `RELEASE s`} {
		_, err = tx.Exec(q)
		require.NoError(t, err, q)
	}
	_, err = tx.Exec(`INSERT INTO t VALUES ('taken')`)
	require.Error(t, err, "a statement that fails alone")
	_, err = tx.Exec(`INSERT INTO t VALUES ('kept')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, []string{"kept", "taken"}, ids())
}
