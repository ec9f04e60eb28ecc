package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
)

// The SQL of EndStaleOwner, PostgreSQL's alone.
const (
	// qStaleOwner reads the owner of a lease that expired, unless it is
	// the member asking or a live member of the group: a process that
	// froze past its lease (its heartbeat expired with it), not one that
	// handed the lease back (no owner) or renews it late.
	qStaleOwner = `SELECT l.owner FROM {p}partition_leases l
WHERE l.consumer = ? AND l.partition = ? AND l.owner <> '' AND l.owner <> ? AND l.expires_at < {now}
AND NOT EXISTS (SELECT 1 FROM {p}consumer_members m
    WHERE m.consumer = l.consumer AND m.member = l.owner AND m.expires_at >= {now})`
	// qEndSessions ends the sessions named after a member
	// (application_name): what they hold, a transaction's locks, a
	// session's advisory locks, is released as each backend exits. It
	// ends those of every database of the server, so that a transport's
	// database beside the stores' is covered too (a member's name is
	// its own: host, process id and random bytes).
	//
	// pg_terminate_backend runs in the select list, for the rows the
	// WHERE kept only (OFFSET 0 keeps the subquery whole).
	//
	// It ends none while a session of the member began or ended a
	// statement within the quiet time (the last argument, in
	// microseconds): a process that runs late, its heartbeat missed on
	// a loaded machine, is still at work; one that froze is silent.
	qEndSessions = `SELECT pid FROM (SELECT pid, pg_terminate_backend(pid) AS ended FROM pg_stat_activity
WHERE application_name = ? AND pid <> pg_backend_pid()
AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = ? AND a.pid <> pg_backend_pid()
    AND a.state_change >= statement_timestamp() - ?::float8 * interval '1 microsecond')
OFFSET 0) AS s WHERE ended`
	// qSessionsLeft counts the sessions of a list that have not exited.
	qSessionsLeft = `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(?::integer[])`
)

// sessionExitPoll is how often EndStaleOwner looks whether the sessions
// it ended have exited.
const sessionExitPoll = 10 * time.Millisecond

var _ driver.SessionEnder = (*Store)(nil)

// sqlStateInsufficientPrivilege is PostgreSQL's error of
// pg_terminate_backend on a session of another role, without the
// privileges of that role or of pg_signal_backend.
const sqlStateInsufficientPrivilege = "42501"

// EndStaleOwner implements driver.SessionEnder. On SQLite it does
// nothing: a process's connections are its own, and go with it.
func (s *Store) EndStaleOwner(ctx context.Context, consumer string, partition int, member string, quiet time.Duration) (string, int, error) {
	if s.dialect != Postgres {
		return "", 0, nil
	}
	var owner string
	err := s.db.GetContext(ctx, &owner, s.leaseSQL(qStaleOwner), consumer, partition, member)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", 0, nil
	case err != nil:
		return "", 0, fmt.Errorf("read the stale owner of partition %d of %s: %w", partition, consumer, err)
	}
	var ended []int64
	if err := s.db.SelectContext(ctx, &ended, s.q.sql(qEndSessions), owner, owner, float64(quiet.Microseconds())); err != nil {
		if sqlState(err) == sqlStateInsufficientPrivilege {
			return owner, 0, fmt.Errorf("end the sessions of %s, the stale owner of partition %d of %s: %w "+
				"(run the consumer's processes as one database role, or grant theirs pg_signal_backend)", owner, partition, consumer, err)
		}
		return owner, 0, fmt.Errorf("end the sessions of %s, the stale owner of partition %d of %s: %w", owner, partition, consumer, err)
	}
	if len(ended) == 0 {
		return owner, 0, nil
	}
	waitExited(ctx, func(ctx context.Context) (int, error) {
		var left int
		err := s.db.GetContext(ctx, &left, s.q.sql(qSessionsLeft), ended)
		return left, err
	})
	return owner, len(ended), nil
}

// waitExited polls left until it counts none, fails, or ctx ends: a
// backend signalled to end has not released its locks yet.
func waitExited(ctx context.Context, left func(ctx context.Context) (int, error)) {
	for {
		n, err := left(ctx)
		if err != nil || n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(sessionExitPoll):
		}
	}
}
