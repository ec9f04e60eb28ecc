package outage_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sync"
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
		{"UnexpectedEOF", fmt.Errorf("exec: %w", io.ErrUnexpectedEOF), true},
		{"Reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"BrokenPipe", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, true},
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

// TestIsOnReset checks the errors pgx gives when a connection is reset
// (TCP RST) in the middle of a transaction, at a statement and at the
// commit, as a network fault does: pgx reports the network's error
// (connection reset by peer, or unexpected EOF), not ErrConnClosed, and
// the retry step dead-lettered valid events as retries_exhausted for
// them (internal/faults' TestResetPeerMidStream).
func TestIsOnReset(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u, err := url.Parse(testenv.PostgresURL(t))
	require.NoError(t, err)
	proxy := newResetProxy(t, u.Host)
	u.Host = proxy.addr()
	db, err := sql.Open("pgx", u.String())
	require.NoError(t, err)
	defer db.Close()

	for _, at := range []string{"Statement", "Commit"} {
		t.Run(at, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback() }()
			_, err = tx.ExecContext(ctx, "SELECT 1")
			require.NoError(t, err)
			proxy.reset()
			if at == "Statement" {
				_, err = tx.ExecContext(ctx, "SELECT 1")
			} else {
				err = tx.Commit()
			}
			require.Error(t, err)
			require.True(t, outage.Is(err), "a connection reset: %v", err)
		})
	}
}

// resetProxy forwards TCP connections to upstream until reset resets
// every one of them (SO_LINGER 0, so the close sends an RST).
type resetProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	conns    []*net.TCPConn
}

func newResetProxy(t *testing.T, upstream string) *resetProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &resetProxy{ln: ln, upstream: upstream}
	t.Cleanup(func() {
		_ = ln.Close()
		p.reset()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c.(*net.TCPConn), up.(*net.TCPConn))
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	return p
}

func (p *resetProxy) addr() string { return p.ln.Addr().String() }

func (p *resetProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
	p.conns = nil
}
