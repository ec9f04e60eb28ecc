package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
)

// The replays' SQL. A replay is a row of its own: the same dead letter
// replayed twice is two rows.
const (
	qAddReplay = `INSERT INTO {p}replays (dead_letter_id, consumer, topic, body, metadata, created_at)
VALUES (?, ?, ?, ?, ?, ?)`

	replayColumns = `id, dead_letter_id, consumer, topic, body, metadata, created_at`

	// qClaimReplays takes a lease on the oldest unsent replays that no
	// other relay holds, in one short write, and returns them; a relay
	// that dies holding a lease leaves its replays to the next one once
	// the lease ends. On SQLite the write lock makes claims take turns.
	// Of the oldest rows up to the limit, it takes the first and each next
	// one while the bodies up to it come to at most a byte budget
	// (driver.ReplayClaimBytes); octet_length reads a body's size, not
	// its overflow pages. RETURNING gives no order: the caller sorts by
	// id. Its arguments: the lease's end, now, the limit, the budget.
	qClaimReplays = `UPDATE {p}replays SET claimed_until = ?
WHERE id IN (SELECT id FROM (
    SELECT id, row_number() OVER w AS n, sum(size) OVER w AS upto FROM (
        SELECT id, octet_length(body) AS size FROM {p}replays
        WHERE sent_at IS NULL AND (claimed_until IS NULL OR claimed_until < ?)
        ORDER BY id LIMIT ?) WINDOW w AS (ORDER BY id))
    WHERE n = 1 OR upto <= ?)
RETURNING ` + replayColumns

	// qClaimReplaysLocked is qClaimReplays on PostgreSQL: the rows are
	// chosen and locked first (a materialized CTE, so that the limit holds
	// and the choice is made once), skipping those that a concurrent claim
	// has locked; a row that a claim committed meanwhile is checked again
	// as that claim left it. Those that fit in the budget are leased; the
	// others' locks end with the statement. Its arguments: now, the
	// limit, the budget, the lease's end. It runs after qIndexScansOnly in
	// a transaction of its own.
	qClaimReplaysLocked = `WITH claimed AS MATERIALIZED (
    SELECT id, octet_length(body) AS size FROM {p}replays
    WHERE sent_at IS NULL AND (claimed_until IS NULL OR claimed_until < ?)
    ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED),
fitting AS (
    SELECT id FROM (SELECT id, row_number() OVER w AS n, sum(size) OVER w AS upto FROM claimed WINDOW w AS (ORDER BY id)) c
    WHERE n = 1 OR upto <= ?)
UPDATE {p}replays r SET claimed_until = ? FROM fitting WHERE r.id = fitting.id
RETURNING r.id, r.dead_letter_id, r.consumer, r.topic, r.body, r.metadata, r.created_at`

	// qReplaysDue tells whether a claim would find a replay, by a read
	// of the unsent rows' index: a relay that polls an empty table takes
	// no write lock (SQLite has one for the whole database).
	qReplaysDue = `SELECT EXISTS (SELECT 1 FROM {p}replays
    WHERE sent_at IS NULL AND (claimed_until IS NULL OR claimed_until < ?))`

	qReplaySent   = `UPDATE {p}replays SET sent_at = ? WHERE id = ? AND sent_at IS NULL`
	qReplayExists = `SELECT id FROM {p}replays WHERE id = ?`
)

// AddReplays implements driver.Store, in a transaction of its own.
func (s *Store) AddReplays(ctx context.Context, rs []driver.Replay) error {
	if len(rs) == 0 {
		return nil
	}
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("add %d replays: begin: %w", len(rs), err)
	}
	defer tx.Rollback() // a no-op after Commit
	if err := s.addReplays(ctx, tx, rs, s.now()); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("add %d replays: commit: %w", len(rs), err)
	}
	return nil
}

// addReplays inserts rs inside tx, created at at.
func (s *Store) addReplays(ctx context.Context, tx *sqlx.Tx, rs []driver.Replay, at time.Time) error {
	query := s.q.sql(qAddReplay)
	for _, r := range rs {
		if r.Consumer == "" {
			return errors.New("add replay: Consumer is empty")
		}
		meta, err := encodeMetadata(r.Metadata)
		if err != nil {
			return fmt.Errorf("add replay for %s: %w", r.Consumer, err)
		}
		body := r.Body
		if body == nil {
			body = []byte{}
		}
		if _, err := tx.ExecContext(ctx, query,
			r.DeadLetterID, r.Consumer, r.Topic, body, meta, s.dialect.timeArg(at)); err != nil {
			return fmt.Errorf("add replay for %s: %w", r.Consumer, err)
		}
	}
	return nil
}

// ClaimReplays implements driver.Store: a lease (claimed_until) on
// both dialects, taken in one statement by the store's clock, after a
// read that finds whether any replay is due (the relay polls: an idle
// poll writes nothing). On PostgreSQL the statement runs in a transaction
// that reads the table through its indexes only (qIndexScansOnly).
func (s *Store) ClaimReplays(ctx context.Context, limit int, lease time.Duration) (rs []driver.Replay, err error) {
	err = s.bounded(ctx, func(ctx context.Context) (err error) {
		rs, err = s.claim(ctx, limit, lease)
		return err
	})
	return rs, err
}

// claim is ClaimReplays's call.
func (s *Store) claim(ctx context.Context, limit int, lease time.Duration) ([]driver.Replay, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("claim replays: limit %d, want at least 1", limit)
	}
	if lease <= 0 {
		return nil, fmt.Errorf("claim replays: lease %s, want more than 0", lease)
	}
	now := s.now()
	until, nowArg := s.dialect.timeArg(now.Add(lease)), s.dialect.timeArg(now)
	var due bool
	if err := s.db.GetContext(ctx, &due, s.q.sql(qReplaysDue), nowArg); err != nil {
		return nil, fmt.Errorf("claim replays: %w", err)
	}
	if !due {
		return nil, nil
	}
	args := []any{until, nowArg, limit, driver.ReplayClaimBytes}
	if s.dialect == Postgres {
		args = []any{nowArg, limit, driver.ReplayClaimBytes, until}
	}
	out, err := s.claimReplaysIn(ctx, args)
	if err != nil {
		return nil, fmt.Errorf("claim replays: %w", err)
	}
	slices.SortFunc(out, func(a, b driver.Replay) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// claimReplaysIn runs the claim of replays with args: on SQLite alone, on
// PostgreSQL in a transaction of its own after qIndexScansOnly.
func (s *Store) claimReplaysIn(ctx context.Context, args []any) ([]driver.Replay, error) {
	if s.dialect != Postgres {
		rows, err := s.db.QueryxContext(ctx, s.claimReplays, args...)
		if err != nil {
			return nil, err
		}
		return scanReplays(rows)
	}
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() // a no-op after Commit
	if err := indexScansOnly(ctx, tx, 0); err != nil {
		return nil, err
	}
	rows, err := tx.QueryxContext(ctx, s.claimReplays, args...)
	if err != nil {
		return nil, err
	}
	out, err := scanReplays(rows)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return out, nil
}

// ReplaySent implements driver.Store. A replay marked sent before stays
// as it was; an unknown id is driver.ErrNotFound.
func (s *Store) ReplaySent(ctx context.Context, id int64) error {
	res, err := s.exec(ctx, s.q.sql(qReplaySent), s.dialect.timeArg(s.now()), id)
	if err != nil {
		return fmt.Errorf("mark replay %d sent: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("mark replay %d sent: rows affected: %w", id, err)
	}
	if n == 1 {
		return nil
	}
	var got int64
	err = s.db.QueryRowxContext(ctx, s.q.sql(qReplayExists), id).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("mark replay %d sent: %w", id, driver.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("mark replay %d sent: %w", id, err)
	}
	return nil
}

// scanReplays reads and closes rows of replayColumns.
func scanReplays(rows *sqlx.Rows) (_ []driver.Replay, err error) {
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	var out []driver.Replay
	for rows.Next() {
		var (
			r       driver.Replay
			meta    []byte
			created timeValue
		)
		if err := rows.Scan(&r.ID, &r.DeadLetterID, &r.Consumer, &r.Topic, &r.Body, &meta, &created); err != nil {
			return nil, fmt.Errorf("scan replay: %w", err)
		}
		if r.Metadata, err = decodeMetadata(meta); err != nil {
			return nil, fmt.Errorf("replay %d: %w", r.ID, err)
		}
		r.CreatedAt = created.t
		out = append(out, r)
	}
	return out, rows.Err()
}
