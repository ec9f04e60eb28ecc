package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

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
	// qEndSessions ends the sessions of the database named after a
	// member (application_name): what they hold, a transaction's locks,
	// a session's advisory locks, is released as each backend exits.
	qEndSessions = `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = ? AND datname = current_database() AND pid <> pg_backend_pid()`
)

var _ driver.SessionEnder = (*Store)(nil)

// sqlStateInsufficientPrivilege is PostgreSQL's error of
// pg_terminate_backend on a session of another role, without the
// privileges of that role or of pg_signal_backend.
const sqlStateInsufficientPrivilege = "42501"

// EndStaleOwner implements driver.SessionEnder. On SQLite it does
// nothing: a process's connections are its own, and go with it.
func (s *Store) EndStaleOwner(ctx context.Context, consumer string, partition int, member string) (string, int, error) {
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
	var ended int
	if err := s.db.GetContext(ctx, &ended, s.q.sql(qEndSessions), owner); err != nil {
		var state interface{ SQLState() string }
		if errors.As(err, &state) && state.SQLState() == sqlStateInsufficientPrivilege {
			return owner, 0, fmt.Errorf("end the sessions of %s, the stale owner of partition %d of %s: %w "+
				"(run the consumer's processes as one database role, or grant theirs pg_signal_backend)", owner, partition, consumer, err)
		}
		return owner, 0, fmt.Errorf("end the sessions of %s, the stale owner of partition %d of %s: %w", owner, partition, consumer, err)
	}
	return owner, ended, nil
}
