package outage_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/outage"
	"github.com/effectively-once/effectively/internal/testenv"
)

func TestIs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},
		{"Plain", errors.New("boom"), false},
		{"BadConn", fmt.Errorf("exec: %w", driver.ErrBadConn), true},
		{"ConnDone", fmt.Errorf("commit: %w", sql.ErrConnDone), true},
		{"ConnClosed", fmt.Errorf("exec: %w", pgconn.ErrConnClosed), true},
		{"ConnectionFailure", &pgconn.PgError{Code: "08006"}, true},
		{"AdminShutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"CrashShutdown", &pgconn.PgError{Code: "57P02"}, true},
		{"CannotConnectNow", fmt.Errorf("begin: %w", &pgconn.PgError{Code: "57P03"}), true},
		{"QueryCanceled", &pgconn.PgError{Code: "57014"}, false},
		{"UniqueViolation", &pgconn.PgError{Code: "23505"}, false},
		{"DataException", &pgconn.PgError{Code: "22P02"}, false},
		{"Deadline", context.DeadlineExceeded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, outage.Is(tc.err))
		})
	}
}

// TestIsOnRealFailures checks the errors a real PostgreSQL and pgx give:
// a server that is not there, and a connection that the server ends in
// the middle of a transaction (as a restart does).
func TestIsOnRealFailures(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	nowhere, err := sql.Open("pgx", "postgres://effectively:effectively@127.0.0.1:1/nowhere?connect_timeout=2")
	require.NoError(t, err)
	defer nowhere.Close()
	_, err = nowhere.ExecContext(ctx, "SELECT 1")
	require.Error(t, err)
	require.True(t, outage.Is(err), "no server: %v", err)

	// A server that takes the connection and never answers, until the
	// caller's time limit ends the wait: the caller's timeout, not an
	// outage, though pgx reports a ConnectError.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	slow, err := sql.Open("pgx", "postgres://effectively:effectively@"+silent.Addr().String()+"/silent")
	require.NoError(t, err)
	defer slow.Close()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = slow.ExecContext(short, "SELECT 1")
	var connect *pgconn.ConnectError
	require.ErrorAs(t, err, &connect)
	require.False(t, outage.Is(err), "the caller's own time limit: %v", err)

	url := testenv.PostgresURL(t)
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	var pid int
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = tx.ExecContext(ctx, "SELECT 1/0")
	require.Error(t, err)
	require.False(t, outage.Is(err), "a statement's own failure: %v", err)
	require.NoError(t, tx.Rollback())

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	other, err := sql.Open("pgx", url)
	require.NoError(t, err)
	defer other.Close()
	_, err = other.ExecContext(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, "SELECT pg_sleep(0.2), 1")
	require.Error(t, err)
	require.True(t, outage.Is(err), "the server ended the connection: %v", err)
	err = tx.Commit()
	require.Error(t, err)
	require.True(t, outage.Is(err), "commit on the ended connection: %v", err)
}

func TestFull(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},
		{"Plain", errors.New("boom"), false},
		{"DiskFull", fmt.Errorf("commit: %w", &pgconn.PgError{Code: "53100"}), true},
		{"OutOfMemory", &pgconn.PgError{Code: "53200"}, false},
		{"ConnectionFailure", &pgconn.PgError{Code: "08006"}, false},
		{"NoSpace", fmt.Errorf("write: %w", &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, outage.Full(tc.err))
		})
	}
}

// TestFullOnSQLite fills a real SQLite database to its page limit: the
// insert that does not fit fails with SQLITE_FULL, which Full knows, and
// a constraint's failure it does not.
func TestFullOnSQLite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := testenv.SQLite(t).Connx(ctx) // max_page_count is the connection's
	require.NoError(t, err)
	defer db.Close()
	_, err = db.ExecContext(ctx, `CREATE TABLE filler (b BLOB NOT NULL UNIQUE)`)
	require.NoError(t, err)
	var pages int64
	require.NoError(t, db.GetContext(ctx, &pages, `PRAGMA page_count`))
	_, err = db.ExecContext(ctx, fmt.Sprintf(`PRAGMA max_page_count = %d`, pages+2))
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO filler (b) VALUES (zeroblob(1 << 20))`)
	require.Error(t, err)
	require.True(t, outage.Full(err), "%v", err)
	require.False(t, outage.Is(err))

	_, err = db.ExecContext(ctx, `INSERT INTO filler (b) VALUES (x'00')`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO filler (b) VALUES (x'00')`)
	require.Error(t, err)
	require.False(t, outage.Full(err), "%v", err)
}
