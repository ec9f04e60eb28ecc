package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// The SQL of the events parked behind a dead letter (driver.Store).
// A row of parked_events is a wait behind a gap (reason gap, see
// WaitGap), a dead letter that the later events of its subject wait
// behind (dead_letter, see HoldDeadLetter), one of those events (parked,
// see Park), or a dead letter discarded while an earlier event of its
// subject had not taken effect yet, which the subject's sequence skips
// once that one did (skipped, see Skip).
const (
	qHoldCheckpoint = `SELECT seq FROM {p}subject_checkpoints WHERE consumer = ? AND subject = ?`
	qHold           = `INSERT INTO {p}parked_events (consumer, subject, seq, source, event_id, topic, body, metadata, parked_at, reason)
VALUES (?, ?, ?, ?, ?, '', ?, '{}', ?, 'dead_letter')
ON CONFLICT (consumer, subject, seq) DO UPDATE SET
    source = excluded.source, event_id = excluded.event_id, topic = '', body = excluded.body,
    metadata = '{}', parked_at = excluded.parked_at, reason = 'dead_letter'
WHERE ` + qOwnOrWait

	// qOwnOrWait is the condition under which a hold or a parking
	// replaces the row of its sequence: a wait, whoever's (the waiting
	// event's message is still the transport's), or a row of the same
	// event. Another event's parking holds its only copy of its message,
	// and its hold or skip its subject's place in the sequence.
	qOwnOrWait = `{p}parked_events.reason = 'gap'
    OR ({p}parked_events.source = excluded.source AND {p}parked_events.event_id = excluded.event_id)`

	// qBlocked finds a held or parked event between the subject's
	// checkpoint and a sequence.
	qBlocked = `SELECT EXISTS (SELECT 1 FROM {p}parked_events p
WHERE p.consumer = ? AND p.subject = ? AND p.seq < ? AND p.reason IN ('dead_letter', 'parked')
AND p.seq > COALESCE((SELECT c.seq FROM {p}subject_checkpoints c WHERE c.consumer = p.consumer AND c.subject = p.subject), 0))`
	qPark = `INSERT INTO {p}parked_events (consumer, subject, seq, source, event_id, topic, body, metadata, parked_at, reason)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'parked')
ON CONFLICT (consumer, subject, seq) DO UPDATE SET
    source = excluded.source, event_id = excluded.event_id, topic = excluded.topic, body = excluded.body,
    metadata = excluded.metadata, parked_at = excluded.parked_at, reason = 'parked'
WHERE ` + qOwnOrWait
	qUnmark = `DELETE FROM {p}processed_events WHERE consumer = ? AND source = ? AND event_id = ?`
	// qParkGap turns the wait of an event (WaitGap) into its parking,
	// keeping parked_at, when it was first recorded.
	qParkGap = `UPDATE {p}parked_events SET reason = 'parked', topic = ?, body = ?, metadata = ?
WHERE consumer = ? AND subject = ? AND seq = ? AND source = ? AND event_id = ? AND reason IN ('gap', 'parked')`

	// qSeqOwner reads who holds a sequence of a subject, and how.
	qSeqOwner = `SELECT source, event_id, reason FROM {p}parked_events WHERE consumer = ? AND subject = ? AND seq = ?`

	// qParked takes the filter's conditions (those set) and ends with
	// qParkedOrder.
	qParked = `SELECT p.consumer, p.subject, p.seq, p.source, p.event_id, p.topic, p.body, p.metadata,
    p.parked_at, p.reason, COALESCE(c.seq, 0)
FROM {p}parked_events p LEFT JOIN {p}subject_checkpoints c ON c.consumer = p.consumer AND c.subject = p.subject
WHERE p.reason IN ('dead_letter', 'parked')`
	qParkedConsumer = ` AND p.consumer = ?`
	qParkedSubject  = ` AND p.subject = ?`
	// qParkedReady compares seq - 1 (seq >= 1) with the checkpoint: a
	// checkpoint at the largest bigint has no next sequence.
	qParkedReady = ` AND p.reason = 'parked' AND p.seq - 1 = COALESCE(c.seq, 0)`
	qParkedOrder = ` ORDER BY p.consumer, p.subject, p.seq`
	qParkedLimit = ` LIMIT ?`

	// qEndOwnWait removes the wait or parking of an event as its dead
	// letter is stored.
	qEndOwnWait = `DELETE FROM {p}parked_events
WHERE consumer = ? AND subject = ? AND seq = ? AND source = ? AND event_id = ? AND reason IN ('gap', 'parked')`

	qSkipFind   = `SELECT seq FROM {p}parked_events WHERE consumer = ? AND subject = ? AND source = ? AND event_id = ? AND reason = 'dead_letter'`
	qSkipDelete = `DELETE FROM {p}parked_events WHERE consumer = ? AND subject = ? AND seq = ?`
	// qSkipLater turns a hold whose turn has not come into a skip: the
	// checkpoint moves past it once it reaches the sequence before it
	// (qSkipNext).
	qSkipLater = `UPDATE {p}parked_events SET reason = 'skipped' WHERE consumer = ? AND subject = ? AND seq = ?`
	// qSkipNext removes the skip right after the subject's checkpoint,
	// if any; qSkipStep then moves the checkpoint onto it. seq - 1 is
	// compared, as a checkpoint at the largest bigint has no next.
	qSkipNext = `DELETE FROM {p}parked_events WHERE consumer = ? AND subject = ? AND reason = 'skipped'
AND seq - 1 = (SELECT c.seq FROM {p}subject_checkpoints c WHERE c.consumer = ? AND c.subject = ?)`
	qSkipStep = `UPDATE {p}subject_checkpoints SET seq = seq + 1 WHERE consumer = ? AND subject = ?`
)

// hold records, in tx, that the event key, with sequence seq of subject,
// is a dead letter that the later events of its subject wait behind,
// unless the subject's checkpoint is at seq or past it (it took effect,
// or was skipped, meanwhile). It replaces the event's parking or wait.
func (s *Store) hold(ctx context.Context, tx *sqlx.Tx, consumer, subject string, seq int64, key framework.Key, at any) error {
	var c int64
	err := tx.GetContext(ctx, &c, s.q.sql(qHoldCheckpoint), consumer, subject)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if c >= seq {
		return nil
	}
	_, err = tx.ExecContext(ctx, s.q.sql(qHold), consumer, subject, seq, key.Source, key.ID, []byte{}, at)
	return err
}

// Park implements driver.Store.
func (s *Store) Park(ctx context.Context, tx *driver.Tx, p driver.ParkedEvent) (bool, error) {
	if !tx.HasDB() {
		return false, fmt.Errorf("park %s #%d for %s: %w", p.Subject, p.Seq, p.Consumer, ErrNoTx)
	}
	var blocked bool
	if err := tx.GetContext(ctx, &blocked, s.q.sql(qBlocked), p.Consumer, p.Subject, p.Seq); err != nil {
		return false, fmt.Errorf("park %s #%d for %s: %w", p.Subject, p.Seq, p.Consumer, err)
	}
	if !blocked {
		return false, nil
	}
	meta, err := encodeMetadata(p.Metadata)
	if err != nil {
		return false, fmt.Errorf("park %s #%d for %s: %w", p.Subject, p.Seq, p.Consumer, err)
	}
	body := p.Body
	if body == nil {
		body = []byte{}
	}
	res, err := tx.ExecContext(ctx, s.q.sql(qPark), p.Consumer, p.Subject, p.Seq, p.Key.Source, p.Key.ID,
		p.Topic, body, meta, s.dialect.timeArg(s.now()))
	if err != nil {
		return false, fmt.Errorf("park %s #%d for %s: %w", p.Subject, p.Seq, p.Consumer, err)
	}
	switch n, err := res.RowsAffected(); {
	case err != nil:
		return false, fmt.Errorf("park %s #%d for %s: rows affected: %w", p.Subject, p.Seq, p.Consumer, err)
	case n == 0:
		return false, fmt.Errorf("park %s #%d for %s: %w", p.Subject, p.Seq, p.Consumer, driver.ErrSequenceTaken)
	}
	if _, err := tx.ExecContext(ctx, s.q.sql(qUnmark), p.Consumer, p.Key.Source, p.Key.ID); err != nil {
		return false, fmt.Errorf("park %s #%d for %s: remove the mark: %w", p.Subject, p.Seq, p.Consumer, err)
	}
	return true, nil
}

// ParkGap implements driver.Store, in one transaction.
func (s *Store) ParkGap(ctx context.Context, p driver.ParkedEvent) (parked bool, err error) {
	err = s.bounded(ctx, func(ctx context.Context) (err error) {
		parked, err = s.parkGap(ctx, p)
		return err
	})
	return parked, err
}

// parkGap is ParkGap's call.
func (s *Store) parkGap(ctx context.Context, p driver.ParkedEvent) (bool, error) {
	meta, err := encodeMetadata(p.Metadata)
	if err != nil {
		return false, fmt.Errorf("park %s #%d for %s behind a gap: %w", p.Subject, p.Seq, p.Consumer, err)
	}
	body := p.Body
	if body == nil {
		body = []byte{}
	}
	var parked bool
	err = s.inTx(ctx, func(tx *sqlx.Tx) error {
		// The checkpoint's row, taken as an attempt on the subject takes
		// it: an attempt that moves it to p.Seq-1 either commits first,
		// or sees the parked event in its EndWait.
		c, err := s.lockCheckpoint(ctx, tx, p.Consumer, p.Subject)
		if err != nil {
			return err
		}
		if c >= p.Seq-1 {
			return nil // its turn came
		}
		res, err := tx.ExecContext(ctx, s.q.sql(qParkGap), p.Topic, body, meta,
			p.Consumer, p.Subject, p.Seq, p.Key.Source, p.Key.ID)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil || n == 1 {
			parked = err == nil
			return err
		}
		var owner struct {
			Source  string `db:"source"`
			EventID string `db:"event_id"`
			Reason  string `db:"reason"`
		}
		switch err := tx.GetContext(ctx, &owner, s.q.sql(qSeqOwner), p.Consumer, p.Subject, p.Seq); {
		case errors.Is(err, sql.ErrNoRows):
			return nil // no wait: it ended
		case err != nil:
			return err
		case owner.Reason != "gap" && (owner.Source != p.Key.Source || owner.EventID != p.Key.ID):
			return driver.ErrSequenceTaken
		}
		return nil
	}, "park %s #%d for %s behind a gap", p.Subject, p.Seq, p.Consumer)
	return parked, err
}

// Parked implements driver.Store.
func (s *Store) Parked(ctx context.Context, f driver.ParkedFilter) (ps []driver.ParkedEvent, err error) {
	err = s.bounded(ctx, func(ctx context.Context) (err error) {
		ps, err = s.parked(ctx, f)
		return err
	})
	return ps, err
}

// parked is Parked's call.
func (s *Store) parked(ctx context.Context, f driver.ParkedFilter) (_ []driver.ParkedEvent, err error) {
	if !storableText(f.Consumer, f.Subject) {
		return nil, nil // no row holds it (PostgreSQL would refuse the query)
	}
	var (
		query strings.Builder
		args  []any
	)
	query.WriteString(qParked)
	if f.Consumer != "" {
		query.WriteString(qParkedConsumer)
		args = append(args, f.Consumer)
	}
	if f.Subject != "" {
		query.WriteString(qParkedSubject)
		args = append(args, f.Subject)
	}
	if f.Ready {
		query.WriteString(qParkedReady)
	}
	query.WriteString(qParkedOrder)
	if f.Limit > 0 {
		query.WriteString(qParkedLimit)
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryxContext(ctx, s.q.sql(query.String()), args...)
	if err != nil {
		return nil, fmt.Errorf("list parked events: %w", err)
	}
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("list parked events: %w", cerr)
		}
	}()
	var out []driver.ParkedEvent
	for rows.Next() {
		var (
			p          driver.ParkedEvent
			meta       []byte
			at         timeValue
			reason     string
			checkpoint int64
		)
		if err := rows.Scan(&p.Consumer, &p.Subject, &p.Seq, &p.Key.Source, &p.Key.ID, &p.Topic, &p.Body, &meta,
			&at, &reason, &checkpoint); err != nil {
			return nil, fmt.Errorf("list parked events: %w", err)
		}
		if p.Metadata, err = decodeMetadata(meta); err != nil {
			return nil, fmt.Errorf("parked %s #%d: %w", p.Subject, p.Seq, err)
		}
		p.At = at.t
		p.Held = reason == "dead_letter"
		p.Ready = !p.Held && p.Seq == checkpoint+1
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list parked events: %w", err)
	}
	return out, nil
}

// Skip implements driver.Store, in one transaction. It takes the
// subject's checkpoint as an attempt does: a hold whose turn has come is
// removed and the checkpoint moves onto it; one behind an event that has
// not taken effect yet becomes a skip, which the checkpoint moves past
// once that event took effect (skipPast), so that no event but the
// discarded one is skipped.
func (s *Store) Skip(ctx context.Context, consumer, subject string, key framework.Key) (int64, error) {
	var seq int64
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		if err := tx.GetContext(ctx, &seq, s.q.sql(qSkipFind), consumer, subject, key.Source, key.ID); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return driver.ErrNotFound
			}
			return err
		}
		c, err := s.lockCheckpoint(ctx, tx, consumer, subject)
		if err != nil {
			return err
		}
		if seq-1 > c {
			_, err := tx.ExecContext(ctx, s.q.sql(qSkipLater), consumer, subject, seq)
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q.sql(qSkipDelete), consumer, subject, seq); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q.sql(qAdvance), consumer, subject, seq); err != nil {
			return err
		}
		return s.skipPast(ctx, tx, consumer, subject)
	}, "skip the dead letter %s of %s for %s", key, subject, consumer)
	if err != nil {
		return 0, err
	}
	return seq, nil
}

// skipPast moves the checkpoint of (consumer, subject) in tx past the
// skips (see Skip) right after it, one after the other.
func (s *Store) skipPast(ctx context.Context, tx sqlx.ExecerContext, consumer, subject string) error {
	for {
		res, err := tx.ExecContext(ctx, s.q.sql(qSkipNext), consumer, subject, consumer, subject)
		if err != nil {
			return fmt.Errorf("skip past the discarded: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("skip past the discarded: rows affected: %w", err)
		}
		if n == 0 {
			return nil
		}
		if _, err := tx.ExecContext(ctx, s.q.sql(qSkipStep), consumer, subject); err != nil {
			return fmt.Errorf("skip past the discarded: %w", err)
		}
	}
}

// exec runs query, one write, outside any transaction. On SQLite it runs
// in a transaction of its own, which takes the file's write lock the way
// the service's transactions do (sqlite's write gate, whose BEGIN tries
// again every millisecond at most): a statement alone waits for the lock
// in SQLite's busy handler, whose sleeps grow to 100 ms and lose it again
// and again to a busy writer of another process: behind eight writers
// of another connection, a lone write waited up to 1.4 s under the race
// detector where a transaction waited 20 ms. A purge's release of its
// lease that waits past its 5 s leaves the lease to end by itself, two
// minutes on, every purge kept out meanwhile (the likely cause of a
// TestPurgeRace failure on a loaded machine). On PostgreSQL it runs
// alone.
func (s *Store) exec(ctx context.Context, query string, args ...any) (res sql.Result, err error) {
	if s.dialect != SQLite {
		return s.db.ExecContext(ctx, query, args...)
	}
	err = s.tx(ctx, func(tx *sqlx.Tx) error {
		res, err = tx.ExecContext(ctx, query, args...)
		return err
	})
	return res, err
}

// inTx runs fn in a transaction of its own, and wraps its error with the
// context that format and args give.
func (s *Store) inTx(ctx context.Context, fn func(tx *sqlx.Tx) error, format string, args ...any) error {
	if err := s.tx(ctx, fn); err != nil {
		return fmt.Errorf(format+": %w", append(args, err)...)
	}
	return nil
}

// tx runs fn in a transaction of its own: fn's error as it is, or that of
// the begin or the commit.
func (s *Store) tx(ctx context.Context, fn func(tx *sqlx.Tx) error) error {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() // a no-op after Commit
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
