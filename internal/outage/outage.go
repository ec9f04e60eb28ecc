// Package outage tells a failure of the database itself from a failure of
// a statement or a handler: the server unreachable, shutting down or
// starting up, or a connection it broke (Is), or its disk full (Full). Such a failure is no fault of
// the message being handled, so the consumer chain never dead-letters a
// message for it (see middleware's retry step).
package outage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
)

// Is reports whether err, or an error it wraps, says that the database
// could not be reached or dropped the connection: database/sql's
// driver.ErrBadConn and sql.ErrConnDone; pgx's ConnectError (no
// connection could be made) and ErrConnClosed (the connection broke); a
// connection that broke under a statement (the peer reset it, ECONNRESET
// or EPIPE, or closed it mid-message, io.ErrUnexpectedEOF), which pgx
// reports as the network's error, not as ErrConnClosed;
// PostgreSQL's SQLSTATE class 08 (connection exception) and 57P01 to
// 57P03 (the server shuts down, crashed, or cannot take connections yet).
//
// A failure that a context's end caused is not one, even where pgx
// reports it as a ConnectError: an attempt's own time limit that ran out
// while it waited for a connection is the attempt's timeout.
func Is(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNABORTED) {
		return true
	}
	var connect *pgconn.ConnectError
	if errors.As(err, &connect) {
		return true
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch {
		case strings.HasPrefix(pg.Code, "08"), pg.Code == "57P01", pg.Code == "57P02", pg.Code == "57P03":
			return true
		}
	}
	return false
}

// sqliteFull is SQLite's primary result code SQLITE_FULL: the database or
// its disk is full.
const sqliteFull = 13

// Full reports whether err, or an error it wraps, says that the database
// has no space left to write: PostgreSQL's SQLSTATE 53100 (disk_full),
// SQLite's SQLITE_FULL (with any extended code), or the system's ENOSPC.
// Like an unreachable database, it is no fault of the message: writes
// fail until space comes back, and reads go on.
func Full(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.ENOSPC) {
		return true
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "53100"
	}
	var lite *sqlite.Error
	return errors.As(err, &lite) && lite.Code()&0xff == sqliteFull
}
