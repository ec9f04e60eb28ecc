package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
)

// The SQL of partitioned consumer groups (driver.Leases). "{now}" is the
// database's time, "{until}" the database's time plus a ttl given as an
// argument (see leaseTime): processes need not agree on their clocks.
const (
	qHeartbeat = `INSERT INTO {p}consumer_members (consumer, member, expires_at) VALUES (?, ?, {until})
ON CONFLICT (consumer, member) DO UPDATE SET expires_at = excluded.expires_at`
	// qForgetMembersPostgres skips the rows that a member renewing its
	// own, or another heartbeat forgetting them, has locked: a heartbeat
	// waits for no row but its own, so two never wait for each other.
	qForgetMembersPostgres = `DELETE FROM {p}consumer_members WHERE (consumer, member) IN (
SELECT consumer, member FROM {p}consumer_members WHERE consumer = ? AND expires_at < {now} FOR UPDATE SKIP LOCKED)`
	qForgetMembersSQLite = `DELETE FROM {p}consumer_members WHERE consumer = ? AND expires_at < {now}`
	qLiveMembers         = `SELECT member FROM {p}consumer_members WHERE consumer = ? AND expires_at >= {now}`
	qLeaveGroup          = `DELETE FROM {p}consumer_members WHERE consumer = ? AND member = ?`
	qFreeLeases          = `UPDATE {p}partition_leases SET owner = '', expires_at = {now} WHERE consumer = ? AND owner = ?`

	// qAcquirePartition takes a lease that is free (owner ''), expired or
	// the member's own, in one statement: two members that take it at
	// once meet on the row (ON CONFLICT waits for the other's insert or
	// update), and the WHERE of the update, checked against the row as it
	// is then, lets one of them have it. The token grows unless the
	// member renews a lease it still holds. On PostgreSQL the update
	// locks the row FOR UPDATE (it sets the token, a key column), so it
	// waits for the attempts that fenced the lease (see qFencePostgres).
	// The NOT EXISTS reads the row without locking it: another member's
	// take of a lease still held returns at once instead of waiting for
	// them. The arguments are the consumer, partition, member and ttl,
	// then consumer, partition and member again.
	qAcquirePartition = `INSERT INTO {p}partition_leases (consumer, partition, owner, token, expires_at)
SELECT ?, CAST(? AS INTEGER), ?, 1, {until}
WHERE NOT EXISTS (SELECT 1 FROM {p}partition_leases
    WHERE consumer = ? AND partition = ? AND owner <> ? AND owner <> '' AND expires_at >= {now})
ON CONFLICT (consumer, partition) DO UPDATE SET
    owner = excluded.owner,
    expires_at = excluded.expires_at,
    token = CASE WHEN {p}partition_leases.owner = excluded.owner AND {p}partition_leases.expires_at >= {now}
        THEN {p}partition_leases.token ELSE {p}partition_leases.token + 1 END
WHERE {p}partition_leases.owner = excluded.owner OR {p}partition_leases.owner = ''
    OR {p}partition_leases.expires_at < {now}
RETURNING token`
	// qRenewPartitions extends the member's leases that have not
	// expired: an expired one must be taken again (and gets a new token).
	qRenewPartitions = `UPDATE {p}partition_leases SET expires_at = {until}
WHERE consumer = ? AND owner = ? AND expires_at >= {now} RETURNING partition, token`
	qReleasePartition = `UPDATE {p}partition_leases SET owner = '', expires_at = {now}
WHERE consumer = ? AND partition = ? AND owner = ?`
	// qPartitionCount records a count unless one is, and returns the
	// recorded one (the row that conflicted, through the update that
	// changes nothing).
	qPartitionCount = `INSERT INTO {p}consumer_partitions (consumer, partitions) VALUES (?, ?)
		ON CONFLICT (consumer) DO UPDATE SET partitions = {p}consumer_partitions.partitions RETURNING partitions`
	qRecordedPartitions = `SELECT partitions FROM {p}consumer_partitions WHERE consumer = ?`
	qSetPartitionCount  = `INSERT INTO {p}consumer_partitions (consumer, partitions) VALUES (?, ?)
		ON CONFLICT (consumer) DO UPDATE SET partitions = excluded.partitions`
	qPartitionLeases = `SELECT consumer, partition, owner, token, expires_at FROM {p}partition_leases
WHERE consumer = ? ORDER BY partition`

	// qFencePostgres reads the leases of a batch's partitions and locks
	// them FOR KEY SHARE until the attempt's transaction ends: a change
	// of owner (qAcquirePartition) changes the token, a key column (see
	// the unique key of the migration), and so waits until then, while
	// the owner's renewals and releases, which change no key column, do
	// not. That keeps a renewal, which locks several leases, from
	// deadlocking with a batch that fences some of them after it. On
	// SQLite (qFenceSQLite) the attempt's transaction holds the file's
	// write lock since it began, and a change of owner waits for it.
	qFencePostgres = `SELECT partition, owner, token, expires_at >= {now} AS live FROM {p}partition_leases
WHERE consumer = ? AND partition = ANY(?::integer[]) ORDER BY partition FOR KEY SHARE`
	qFenceSQLite = `SELECT partition, owner, token, expires_at >= {now} AS live FROM {p}partition_leases
WHERE consumer = ? AND partition IN (SELECT value FROM json_each(?)) ORDER BY partition`
)

var _ driver.Leases = (*Store)(nil)

// leaseTime returns the SQL of the database's time and of its time plus
// a ttl argument, and the argument of ttl, in d's dialect. On PostgreSQL
// the time is statement_timestamp(), the start of the statement, rather
// than now(), the start of the transaction, which an attempt's may have
// begun a while before its fences are checked. SQLite's unixepoch is in
// seconds, with milliseconds ('subsec'); it stores nanoseconds.
func leaseTime(d Dialect) (now, until string) {
	if d == Postgres {
		return `statement_timestamp()`, `statement_timestamp() + ?::float8 * interval '1 microsecond'`
	}
	now = `CAST(unixepoch('subsec') * 1000000000 AS INTEGER)`
	return now, now + ` + ?`
}

// ttlArg returns ttl as the dialect's {until} takes it.
func (d Dialect) ttlArg(ttl time.Duration) any {
	if d == Postgres {
		return float64(ttl.Microseconds())
	}
	return ttl.Nanoseconds()
}

// leaseSQL returns a statement of the leases with the prefix, the
// dialect's placeholders and its time.
func (s *Store) leaseSQL(q string) string {
	now, until := leaseTime(s.dialect)
	return s.q.sql(strings.NewReplacer("{now}", now, "{until}", until).Replace(q))
}

// errTTL is returned for a ttl that is not positive.
var errTTL = errors.New("ttl must be positive")

// Heartbeat implements driver.Leases, in one transaction.
func (s *Store) Heartbeat(ctx context.Context, consumer, member string, ttl time.Duration) ([]string, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("heartbeat of %s in %s: %w, got %s", member, consumer, errTTL, ttl)
	}
	var members []string
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, s.leaseSQL(qHeartbeat), consumer, member, s.dialect.ttlArg(ttl)); err != nil {
			return err
		}
		forget := s.dialect.pick(qForgetMembersPostgres, qForgetMembersSQLite)
		if _, err := tx.ExecContext(ctx, s.leaseSQL(forget), consumer); err != nil {
			return fmt.Errorf("forget the expired members: %w", err)
		}
		if err := tx.SelectContext(ctx, &members, s.leaseSQL(qLiveMembers), consumer); err != nil {
			return fmt.Errorf("read the live members: %w", err)
		}
		return nil
	}, "heartbeat of %s in %s", member, consumer)
	if err != nil {
		return nil, err
	}
	slices.Sort(members)
	return members, nil
}

// Leave implements driver.Leases, in one transaction: the member's
// leases are free (no owner) and expired, their tokens kept.
func (s *Store) Leave(ctx context.Context, consumer, member string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, s.leaseSQL(qLeaveGroup), consumer, member); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.leaseSQL(qFreeLeases), consumer, member); err != nil {
			return fmt.Errorf("free its leases: %w", err)
		}
		return nil
	}, "leave %s as %s", consumer, member)
}

// sqlStateUniqueViolation is PostgreSQL's error of a duplicate key.
const sqlStateUniqueViolation = "23505"

// Acquire implements driver.Leases, in one statement.
func (s *Store) Acquire(ctx context.Context, consumer string, partition int, member string, ttl time.Duration) (int64, bool, error) {
	if ttl <= 0 {
		return 0, false, fmt.Errorf("acquire partition %d of %s for %s: %w, got %s", partition, consumer, member, errTTL, ttl)
	}
	var (
		tokens []int64
		err    error
	)
	for range 2 {
		tokens = nil
		err = s.db.SelectContext(ctx, &tokens, s.leaseSQL(qAcquirePartition),
			consumer, partition, member, s.dialect.ttlArg(ttl), consumer, partition, member)
		// Two first takes of a partition raced: ON CONFLICT waits on
		// its arbiter, (consumer, partition), but the row's other unique
		// key, (consumer, partition, token), may report the other's
		// insert first (PostgreSQL checks a key that is no arbiter
		// without ON CONFLICT). The row exists now: the take made again
		// meets it as a conflict.
		if sqlState(err) != sqlStateUniqueViolation {
			break
		}
	}
	if err != nil {
		return 0, false, fmt.Errorf("acquire partition %d of %s for %s: %w", partition, consumer, member, err)
	}
	if len(tokens) == 0 {
		return 0, false, nil
	}
	return tokens[0], true, nil
}

// Renew implements driver.Leases, in one statement: a lease that expired
// is not renewed, even when no one took it since.
func (s *Store) Renew(ctx context.Context, consumer, member string, ttl time.Duration) (map[int]int64, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("renew the leases of %s for %s: %w, got %s", consumer, member, errTTL, ttl)
	}
	rows, err := s.db.QueryContext(ctx, s.leaseSQL(qRenewPartitions), s.dialect.ttlArg(ttl), consumer, member)
	if err != nil {
		return nil, fmt.Errorf("renew the leases of %s for %s: %w", consumer, member, err)
	}
	defer rows.Close()
	held := map[int]int64{}
	for rows.Next() {
		var (
			p     int
			token int64
		)
		if err := rows.Scan(&p, &token); err != nil {
			return nil, fmt.Errorf("renew the leases of %s for %s: %w", consumer, member, err)
		}
		held[p] = token
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("renew the leases of %s for %s: %w", consumer, member, err)
	}
	return held, nil
}

// Release implements driver.Leases: the lease is free (no owner) and
// expired, its token kept.
func (s *Store) Release(ctx context.Context, consumer string, partition int, member string) error {
	if _, err := s.exec(ctx, s.leaseSQL(qReleasePartition), consumer, partition, member); err != nil {
		return fmt.Errorf("release partition %d of %s for %s: %w", partition, consumer, member, err)
	}
	return nil
}

// PartitionLeases implements driver.Leases.
func (s *Store) PartitionLeases(ctx context.Context, consumer string) ([]driver.PartitionLease, error) {
	rows, err := s.db.QueryContext(ctx, s.leaseSQL(qPartitionLeases), consumer)
	if err != nil {
		return nil, fmt.Errorf("list the partition leases of %s: %w", consumer, err)
	}
	defer rows.Close()
	var leases []driver.PartitionLease
	for rows.Next() {
		var (
			l       driver.PartitionLease
			expires timeValue
		)
		if err := rows.Scan(&l.Consumer, &l.Partition, &l.Owner, &l.Token, &expires); err != nil {
			return nil, fmt.Errorf("list the partition leases of %s: %w", consumer, err)
		}
		l.Expires = expires.t
		leases = append(leases, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the partition leases of %s: %w", consumer, err)
	}
	return leases, nil
}

// PartitionCount implements driver.Leases, in one statement.
func (s *Store) PartitionCount(ctx context.Context, consumer string, n int) (int, error) {
	var recorded int
	err := s.db.GetContext(ctx, &recorded, s.leaseSQL(qPartitionCount), consumer, n)
	if errors.Is(err, sql.ErrNoRows) { // recorded by another process meanwhile
		err = s.db.GetContext(ctx, &recorded, s.leaseSQL(qRecordedPartitions), consumer)
	}
	if err != nil {
		return 0, fmt.Errorf("the partition count of %s: %w", consumer, err)
	}
	return recorded, nil
}

// SetPartitionCount implements driver.Leases, in one statement.
func (s *Store) SetPartitionCount(ctx context.Context, consumer string, n int) error {
	if _, err := s.exec(ctx, s.leaseSQL(qSetPartitionCount), consumer, n); err != nil {
		return fmt.Errorf("set the partition count of %s to %d: %w", consumer, n, err)
	}
	return nil
}

// RecordedPartitionCount implements driver.Leases, in one statement.
func (s *Store) RecordedPartitionCount(ctx context.Context, consumer string) (int, error) {
	var recorded int
	err := s.db.GetContext(ctx, &recorded, s.leaseSQL(qRecordedPartitions), consumer)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read the partition count of %s: %w", consumer, err)
	}
	return recorded, nil
}

// Members implements driver.Leases, in one statement that deletes
// nothing: an expired member stays in the table until a heartbeat
// forgets it, and is not listed.
func (s *Store) Members(ctx context.Context, consumer string) ([]string, error) {
	var members []string
	if err := s.db.SelectContext(ctx, &members, s.leaseSQL(qLiveMembers), consumer); err != nil {
		return nil, fmt.Errorf("read the live members of %s: %w", consumer, err)
	}
	slices.Sort(members)
	return members, nil
}

// Fence implements driver.Leases, in one statement for all of fences:
// on PostgreSQL it locks their leases FOR KEY SHARE until tx ends, which
// holds off a change of owner; on SQLite tx holds the file's write lock.
func (s *Store) Fence(ctx context.Context, tx *driver.Tx, consumer, member string, fences []driver.Fence) error {
	if len(fences) == 0 {
		return nil
	}
	if !tx.HasDB() {
		return fmt.Errorf("fence %d partitions of %s for %s: %w", len(fences), consumer, member, ErrNoTx)
	}
	partitions := make([]int64, 0, len(fences))
	for _, f := range fences {
		partitions = append(partitions, int64(f.Partition))
	}
	slices.Sort(partitions)
	partitions = slices.Compact(partitions)
	rows, err := tx.QueryContext(ctx, s.leaseSQL(s.dialect.pick(qFencePostgres, qFenceSQLite)), consumer, s.dialect.idList(partitions))
	if err != nil {
		return fmt.Errorf("fence %d partitions of %s for %s: %w", len(fences), consumer, member, err)
	}
	defer rows.Close()
	leases := make(map[int]fenceRow, len(partitions))
	for rows.Next() {
		var r fenceRow
		if err := rows.Scan(&r.partition, &r.owner, &r.token, &r.live); err != nil {
			return fmt.Errorf("fence %d partitions of %s for %s: %w", len(fences), consumer, member, err)
		}
		leases[r.partition] = r
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("fence %d partitions of %s for %s: %w", len(fences), consumer, member, err)
	}
	for _, f := range fences {
		var lease *driver.PartitionLease
		r, ok := leases[f.Partition]
		if ok {
			lease = &driver.PartitionLease{Consumer: consumer, Partition: f.Partition, Owner: r.owner, Token: r.token}
		}
		if err := f.Check(consumer, member, lease, r.live); err != nil {
			return err
		}
	}
	return nil
}

// fenceRow is a lease as Fence reads it.
type fenceRow struct {
	partition int
	owner     string
	token     int64
	live      bool
}
