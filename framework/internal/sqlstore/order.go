package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// The SQL of strict order (driver.Store).
const (
	// qOrderCheckpoint reads the checkpoint, making its row (seq 0: none
	// yet) when the subject has none, in one round trip; the update that
	// changes nothing locks the row on PostgreSQL, so that attempts on one
	// subject take turns (on SQLite the attempt holds the file's write
	// lock).
	qOrderCheckpoint = `INSERT INTO {p}subject_checkpoints (consumer, subject, seq) VALUES (?, ?, 0)
ON CONFLICT (consumer, subject) DO UPDATE SET seq = {p}subject_checkpoints.seq RETURNING seq`

	qOrderWait = `INSERT INTO {p}parked_events (consumer, subject, seq, source, event_id, body, parked_at, reason)
VALUES (?, ?, ?, ?, ?, ?, ?, 'gap')
ON CONFLICT (consumer, subject, seq) DO NOTHING`
	qOrderWaitingSince = `SELECT parked_at FROM {p}parked_events WHERE consumer = ? AND subject = ? AND seq = ?`
	qOrderEndWait      = `DELETE FROM {p}parked_events WHERE consumer = ? AND subject = ? AND seq = ?`
	// qOrderTaken finds another event's parking, hold or skip at a
	// sequence (a wait is no one's place, see qOwnOrWait).
	qOrderTaken = `EXISTS (SELECT 1 FROM {p}parked_events
WHERE consumer = ? AND subject = ? AND seq = ? AND reason <> 'gap' AND NOT (source = ? AND event_id = ?))`
	// qOrderParkedAfter finds events parked after a sequence, or skips
	// of discarded dead letters (see Skip).
	qOrderParkedAfter = `EXISTS (SELECT 1 FROM {p}parked_events
WHERE consumer = ? AND subject = ? AND seq > ? AND reason IN ('parked', 'skipped'))`
	// qOrderEnding reads qOrderTaken and qOrderParkedAfter, before
	// qOrderEndWait.
	qOrderEnding = `SELECT ` + qOrderTaken + `, ` + qOrderParkedAfter
	// qOrderEndWaitPostgres is qOrderEnding and, unless taken,
	// qOrderEndWait in one round trip.
	qOrderEndWaitPostgres = `WITH taken AS (SELECT ` + qOrderTaken + ` AS t),
gone AS (DELETE FROM {p}parked_events WHERE consumer = ? AND subject = ? AND seq = ? AND NOT (SELECT t FROM taken))
SELECT (SELECT t FROM taken), ` + qOrderParkedAfter
	// qOrderCheckpointMany is qOrderCheckpoint for many subjects, their
	// rows locked in the order of their subjects, so that two batches
	// never wait for each other's rows crosswise (PostgreSQL).
	qOrderCheckpointMany = `INSERT INTO {p}subject_checkpoints (consumer, subject, seq)
SELECT ?, s, 0 FROM unnest(?::text[]) AS s ORDER BY s
ON CONFLICT (consumer, subject) DO UPDATE SET seq = {p}subject_checkpoints.seq RETURNING subject, seq`
	// qMarkCheckpointManyPostgres is qMarkManyPostgres, then
	// qOrderCheckpointMany, in one statement: the checkpoints' insert
	// reads the count of the marks' (an init plan, run first), so the
	// marks are inserted before a checkpoint is locked. Its rows are the
	// keys inserted (0, source, event_id, 0) and the checkpoints
	// (1, subject, '', seq), as qMarkMoveManyPostgres's (markCheckpointRows).
	qMarkCheckpointManyPostgres = `WITH m AS (` + qMarkManyPostgres + `),
c AS (INSERT INTO {p}subject_checkpoints (consumer, subject, seq)
SELECT ?, s, 0 FROM unnest(?::text[]) AS s WHERE (SELECT count(*) FROM m) >= 0 ORDER BY s
ON CONFLICT (consumer, subject) DO UPDATE SET seq = {p}subject_checkpoints.seq RETURNING subject, seq)
SELECT 0, source, event_id, 0::bigint FROM m UNION ALL SELECT 1, subject, '', seq FROM c`
	// qMarkMoveManyPostgres is qMarkManyPostgres, then the moves of some
	// subjects' checkpoints, each from from_seq to to_seq (at least 1) if
	// it is still at from_seq, and qOrderCheckpointMany of others, in one
	// statement (the checkpoints' upsert reads the count of the marks'
	// first, as in qMarkCheckpointManyPostgres). The moves and the others'
	// locks are one upsert, its rows in subject order (a lock's row with
	// seq 0), so that two batches, whatever each moves or only locks, lock
	// their rows in one order and never wait for each other's crosswise.
	// Its rows are the keys inserted (0, source, event_id, 0), the
	// checkpoints of the others (1, subject, '', seq) and whether every
	// move was made and no wait, parked event or skip is after a from_seq
	// (2, '', '', 1 or 0). A move is made when it updated its row, or made
	// it from 0 (a subject's first event): a row gone from under a later
	// checkpoint (purged, say) is no move. A move's compare reads its
	// from_seq out of the arrays by the subject's place (array_position),
	// not from v: a scan of v for each row cost the batch a tenth of its
	// statement.
	qMarkMoveManyPostgres = `WITH m AS (` + qMarkManyPostgres + `),
v AS (SELECT * FROM unnest(?::text[], ?::bigint[], ?::bigint[]) AS v(subject, from_seq, to_seq)),
u AS (INSERT INTO {p}subject_checkpoints AS c (consumer, subject, seq)
SELECT ?, subject, seq FROM (SELECT subject, to_seq AS seq FROM v UNION ALL SELECT s, 0 FROM unnest(?::text[]) AS s) AS w
WHERE (SELECT count(*) FROM m) >= 0 ORDER BY subject
ON CONFLICT (consumer, subject) DO UPDATE SET seq = CASE WHEN excluded.seq = 0 THEN c.seq ELSE excluded.seq END
WHERE excluded.seq = 0 OR c.seq = (?::bigint[])[array_position(?::text[], excluded.subject)]
RETURNING subject, seq, xmax = 0 AS inserted)
SELECT 0, source, event_id, 0::bigint FROM m
UNION ALL SELECT 1, subject, '', seq FROM u WHERE subject NOT IN (SELECT subject FROM v)
UNION ALL SELECT 2, '', '', ((SELECT count(*) FROM u JOIN v USING (subject) WHERE NOT u.inserted OR v.from_seq = 0) = (SELECT count(*) FROM v)
AND NOT EXISTS (SELECT 1 FROM {p}parked_events p JOIN v ON p.subject = v.subject AND p.seq > v.from_seq WHERE p.consumer = ?))::int::bigint`
	// qOrderAdvanceMany moves the checkpoints of many subjects, each to
	// its last step, and reports whether a wait, a parked event or a skip is
	// at or after one of the steps (PostgreSQL).
	qOrderAdvanceMany = `WITH v AS (SELECT * FROM unnest(?::text[], ?::bigint[]) AS v(subject, seq)),
advanced AS (INSERT INTO {p}subject_checkpoints (consumer, subject, seq) SELECT ?, subject, max(seq) FROM v GROUP BY subject ORDER BY subject
ON CONFLICT (consumer, subject) DO UPDATE SET seq = excluded.seq WHERE {p}subject_checkpoints.seq < excluded.seq)
SELECT NOT EXISTS (SELECT 1 FROM {p}parked_events p JOIN v ON p.subject = v.subject AND p.seq >= v.seq WHERE p.consumer = ?)`
	// qOrderAdvanceEndWaitPostgres is qAdvance and qOrderEndWaitPostgres
	// in one round trip.
	qOrderAdvanceEndWaitPostgres = `WITH advanced AS (` + qAdvance + `),
taken AS (SELECT ` + qOrderTaken + ` AS t),
gone AS (DELETE FROM {p}parked_events WHERE consumer = ? AND subject = ? AND seq = ? AND NOT (SELECT t FROM taken))
SELECT (SELECT t FROM taken), ` + qOrderParkedAfter
)

var _ driver.Store = (*Store)(nil)

// Checkpoint implements driver.Store.
func (s *Store) Checkpoint(ctx context.Context, tx *driver.Tx, consumer, subject string) (int64, error) {
	if !tx.HasDB() {
		return 0, fmt.Errorf("checkpoint of %s for %s: %w", subject, consumer, ErrNoTx)
	}
	var seq int64
	if err := tx.GetContext(ctx, &seq, s.q.sql(qOrderCheckpoint), consumer, subject); err != nil {
		return 0, fmt.Errorf("checkpoint of %s for %s: %w", subject, consumer, err)
	}
	return seq, nil
}

// WaitGap implements driver.Store, in one transaction.
func (s *Store) WaitGap(ctx context.Context, consumer, subject string, seq int64, key framework.Key, body []byte) (waited time.Duration, err error) {
	err = s.bounded(ctx, func(ctx context.Context) (err error) {
		waited, err = s.waitGap(ctx, consumer, subject, seq, key, body)
		return err
	})
	return waited, err
}

// waitGap is WaitGap's call.
func (s *Store) waitGap(ctx context.Context, consumer, subject string, seq int64, key framework.Key, body []byte) (time.Duration, error) {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("wait for the gap before %s #%d: begin: %w", subject, seq, err)
	}
	defer tx.Rollback() // a no-op after Commit
	// The checkpoint's row, taken as an attempt on the subject takes it:
	// once the event took effect (another copy of it), its EndWait has
	// removed its wait, which must not come back.
	c, err := s.lockCheckpoint(ctx, tx, consumer, subject)
	if err != nil {
		return 0, fmt.Errorf("wait for the gap before %s #%d: %w", subject, seq, err)
	}
	if c >= seq {
		return 0, nil
	}
	if _, err := tx.ExecContext(ctx, s.q.sql(qOrderWait),
		consumer, subject, seq, key.Source, key.ID, body, s.dialect.timeArg(s.now())); err != nil {
		return 0, fmt.Errorf("wait for the gap before %s #%d: %w", subject, seq, err)
	}
	var since timeValue
	if err := tx.GetContext(ctx, &since, s.q.sql(qOrderWaitingSince), consumer, subject, seq); err != nil {
		return 0, fmt.Errorf("wait for the gap before %s #%d: %w", subject, seq, err)
	}
	// A wait is an outcome, not a lost delivery: it does not count
	// towards the delivery limit. The count stays, at zero: a
	// redelivery without one would count as the second delivery.
	if _, err := tx.ExecContext(ctx, s.q.sql(qZeroDelivery), consumer, key.Source, key.ID, s.dialect.timeArg(s.now())); err != nil {
		return 0, fmt.Errorf("wait for the gap before %s #%d: %w", subject, seq, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("wait for the gap before %s #%d: commit: %w", subject, seq, err)
	}
	return s.now().Sub(since.t), nil
}

// lockCheckpoint reads the checkpoint of (consumer, subject) in tx,
// creating its row when missing, and on PostgreSQL locks it, as Checkpoint
// does for an attempt (on SQLite the transaction holds the file's write
// lock from its first write on).
func (s *Store) lockCheckpoint(ctx context.Context, tx *sqlx.Tx, consumer, subject string) (int64, error) {
	var c int64
	if err := tx.GetContext(ctx, &c, s.q.sql(qOrderCheckpoint), consumer, subject); err != nil {
		return 0, err
	}
	return c, nil
}

// CheckpointMany is Checkpoint of each of subjects, all of consumer, in
// one statement on PostgreSQL (one an attempt on SQLite): the unit of
// work's batch reads and locks its attempts' checkpoints with it (found by
// type assertion, see driver.Delivery.OrderedSubject).
func (s *Store) CheckpointMany(ctx context.Context, tx *driver.Tx, consumer string, subjects []string) (map[string]int64, error) {
	checkpoints := make(map[string]int64, len(subjects))
	if !tx.HasDB() || s.dialect != Postgres {
		for _, subject := range subjects {
			c, err := s.Checkpoint(ctx, tx, consumer, subject)
			if err != nil {
				return nil, err
			}
			checkpoints[subject] = c
		}
		return checkpoints, nil
	}
	rows, err := tx.QueryContext(ctx, s.q.sql(qOrderCheckpointMany), consumer, subjects)
	if err != nil {
		return nil, fmt.Errorf("checkpoints of %d subjects for %s: %w", len(subjects), consumer, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			subject string
			seq     int64
		)
		if err := rows.Scan(&subject, &seq); err != nil {
			return nil, fmt.Errorf("checkpoints of %d subjects for %s: %w", len(subjects), consumer, err)
		}
		checkpoints[subject] = seq
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("checkpoints of %d subjects for %s: %w", len(subjects), consumer, err)
	}
	return checkpoints, nil
}

// AdvanceMany moves the checkpoint of each of subjects, all of consumer,
// to the seq of the same index (a subject may come more than once, its
// steps in order: it moves to the last), in one statement on PostgreSQL,
// and reports clear: no wait, parked event or skip is at or after one of
// the steps, so that no wait is left to end (EndWait). The unit of work's
// batch moves its attempts' checkpoints with it before its commit, and
// runs them again alone when it is not clear.
func (s *Store) AdvanceMany(ctx context.Context, tx *driver.Tx, consumer string, subjects []string, seqs []int64) (bool, error) {
	if !tx.HasDB() || s.dialect != Postgres {
		return false, nil // one at a time, as each attempt alone does
	}
	var clear bool
	if err := tx.GetContext(ctx, &clear, s.advanceMany, subjects, seqs, consumer, consumer); err != nil {
		return false, fmt.Errorf("advance %d checkpoints for %s: %w", len(subjects), consumer, err)
	}
	return clear, nil
}

// MarkMoveMany is MarkMany of keys, then the moves of the checkpoints of
// move, each from the checkpoint of the same index in from to the one in
// to if it is still at from (a compare-and-set), then CheckpointMany of
// lock, all of consumer, in one round trip on PostgreSQL: a batch of
// strict-order events whose process knows the checkpoints its events
// follow moves them before its handlers run (their rows then stay locked
// until it ends), and reads and locks the others. moved reports that
// every move was made and that no wait, parked event or skip is after a
// move's from; the batch's attempts run again alone otherwise. The
// subjects of move are best in order, so that two batches lock their rows
// in one order. Not on SQLite, where a batch holds the file's lock.
func (s *Store) MarkMoveMany(ctx context.Context, tx *driver.Tx, consumer string, keys []framework.Key, lock, move []string, from, to []int64) (first []bool, checkpoints map[string]int64, moved bool, err error) {
	if !tx.HasDB() || s.dialect != Postgres {
		err = errors.ErrUnsupported
	} else {
		sources, ids := keyColumns(uniqueKeys(keys))
		var rows *sql.Rows
		rows, err = tx.QueryContext(ctx, s.markMoveMany,
			consumer, s.dialect.timeArg(s.now()), sources, ids, move, from, to, consumer, lock, from, move, consumer)
		if err == nil {
			first, checkpoints, moved, err = markCheckpointRows(rows, keys)
		}
	}
	if err != nil {
		return nil, nil, false, fmt.Errorf("mark %d events and move the checkpoints of %d subjects for %s: %w", len(keys), len(move), consumer, err)
	}
	return first, checkpoints, moved, nil
}

// AdvanceEndWait is Advance, then EndWait, of an event that took effect
// at its turn, in one round trip on PostgreSQL: strict order's step after
// each handler (the consumer chain finds it by type assertion). Advance's
// report is not returned: an event at its turn always moves the
// checkpoint.
func (s *Store) AdvanceEndWait(ctx context.Context, tx *driver.Tx, consumer, subject string, seq int64, key framework.Key) (bool, error) {
	if !tx.HasDB() || s.dialect != Postgres {
		if _, err := s.Advance(ctx, tx, consumer, subject, seq); err != nil {
			return false, err
		}
		return s.EndWait(ctx, tx, consumer, subject, seq, key)
	}
	var taken, parked bool
	err := tx.QueryRowxContext(ctx, s.q.sql(qOrderAdvanceEndWaitPostgres),
		consumer, subject, seq, // qAdvance
		consumer, subject, seq, key.Source, key.ID, // qOrderTaken
		consumer, subject, seq, // the DELETE
		consumer, subject, seq, // qOrderParkedAfter
	).Scan(&taken, &parked)
	if err != nil {
		return false, fmt.Errorf("advance checkpoint of %s for %s to %d and end its wait: %w", subject, consumer, seq, err)
	}
	if taken {
		return false, fmt.Errorf("end the wait of %s #%d for %s: %w", subject, seq, consumer, driver.ErrSequenceTaken)
	}
	return s.waitEnded(ctx, tx, consumer, subject, seq, parked)
}

// waitEnded is what follows the end of the wait of (consumer, subject,
// seq) in tx: when events are parked after it, the subject's sequence
// skips past the discarded dead letters they wait behind (skipPast). It
// returns parked.
func (s *Store) waitEnded(ctx context.Context, tx *driver.Tx, consumer, subject string, seq int64, parked bool) (bool, error) {
	if !parked {
		return false, nil
	}
	if err := s.skipPast(ctx, tx, consumer, subject); err != nil {
		return false, fmt.Errorf("end the wait of %s #%d for %s: %w", subject, seq, consumer, err)
	}
	return true, nil
}

// EndWait implements driver.Store. Without a transaction it
// commits on its own and reports no parked events. In tx, when events
// are parked after seq, it also moves the checkpoint past the discarded
// dead letters right after it (see Skip).
func (s *Store) EndWait(ctx context.Context, tx *driver.Tx, consumer, subject string, seq int64, key framework.Key) (bool, error) {
	var taken, parked bool
	read := func(q sqlx.QueryerContext, query string, args ...any) error {
		if err := q.QueryRowxContext(ctx, s.q.sql(query), args...).Scan(&taken, &parked); err != nil {
			return fmt.Errorf("end the wait of %s #%d for %s: %w", subject, seq, consumer, err)
		}
		if taken {
			return fmt.Errorf("end the wait of %s #%d for %s: %w", subject, seq, consumer, driver.ErrSequenceTaken)
		}
		return nil
	}
	other := []any{consumer, subject, seq, key.Source, key.ID} // qOrderTaken's
	after := []any{consumer, subject, seq}
	if !tx.HasDB() {
		if err := read(s.db, qOrderEnding, append(other, after...)...); err != nil {
			return false, err
		}
		if _, err := s.exec(ctx, s.q.sql(qOrderEndWait), consumer, subject, seq); err != nil {
			return false, fmt.Errorf("end the wait of %s #%d for %s: %w", subject, seq, consumer, err)
		}
		return false, nil
	}
	if s.dialect == Postgres {
		if err := read(tx, qOrderEndWaitPostgres, append(append(other, consumer, subject, seq), after...)...); err != nil {
			return false, err
		}
	} else {
		if err := read(tx, qOrderEnding, append(other, after...)...); err != nil {
			return false, err
		}
		if _, err := tx.ExecContext(ctx, s.q.sql(qOrderEndWait), consumer, subject, seq); err != nil {
			return false, fmt.Errorf("end the wait of %s #%d for %s: %w", subject, seq, consumer, err)
		}
	}
	return s.waitEnded(ctx, tx, consumer, subject, seq, parked)
}

// qPeek reads, outside any transaction, whether an event is marked or
// its dead letter discarded (a mark would not be taken: see qMarkInto),
// and its subject's checkpoint (0 when none, or no subject).
const qPeek = `SELECT EXISTS (SELECT 1 FROM {p}processed_events WHERE consumer = ? AND source = ? AND event_id = ?)
OR EXISTS (SELECT 1 FROM {p}dead_letters WHERE consumer = ? AND source = ? AND event_id = ? AND status = 'discarded'),
COALESCE((SELECT seq FROM {p}subject_checkpoints WHERE consumer = ? AND subject = ?), 0)`

// Peek reports, in one statement outside any transaction, whether
// consumer processed the event key (or discarded its dead letter: its
// mark would not be taken), and the checkpoint of subject (0
// when it has none; subject may be empty). The unit of work reads it
// before a handler that waits outside the database runs, so that its
// transaction begins only at the handler's first statement, then marks
// and locks what Peek read (found by type assertion).
func (s *Store) Peek(ctx context.Context, consumer string, key framework.Key, subject string) (processed bool, checkpoint int64, err error) {
	err = s.bounded(ctx, func(ctx context.Context) error {
		return s.db.QueryRowxContext(ctx, s.q.sql(qPeek), consumer, key.Source, key.ID, consumer, key.Source, key.ID, consumer, subject).Scan(&processed, &checkpoint)
	})
	if err != nil {
		return false, 0, fmt.Errorf("peek at %s for %s: %w", key, consumer, err)
	}
	return processed, checkpoint, nil
}
