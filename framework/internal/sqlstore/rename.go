package sqlstore

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// The SQL of a consumer's rename: the new name adopts the processed marks,
// the subject checkpoints, the delivery counts, the dead letters, the
// waits, holds and parked events, and the unsent replays of the old one. Marks the new name has are kept; a
// checkpoint keeps the higher sequence; a delivery count of an event that
// both names counted adds the two. Marks and checkpoints are copied (the
// old name keeps its own); counts, dead letters, parked events and replays move, so that
// running it again finds nothing to move twice.
const (
	qAdoptProcessed = `INSERT INTO {p}processed_events (consumer, source, event_id, processed_at)
SELECT ?, source, event_id, processed_at FROM {p}processed_events WHERE consumer = ?
ON CONFLICT (consumer, source, event_id) DO NOTHING`

	qAdoptCheckpoints = `INSERT INTO {p}subject_checkpoints (consumer, subject, seq)
SELECT ?, subject, seq FROM {p}subject_checkpoints WHERE consumer = ?
ON CONFLICT (consumer, subject) DO UPDATE SET seq = excluded.seq
WHERE {p}subject_checkpoints.seq < excluded.seq`

	qAdoptDeliveries = `INSERT INTO {p}deliveries (consumer, source, event_id, count, first_at)
SELECT ?, source, event_id, count, first_at FROM {p}deliveries WHERE consumer = ?
ON CONFLICT (consumer, source, event_id) DO UPDATE SET
    count = {p}deliveries.count + excluded.count,
    first_at = CASE WHEN excluded.first_at < {p}deliveries.first_at
        THEN excluded.first_at ELSE {p}deliveries.first_at END`
	qDropDeliveries = `DELETE FROM {p}deliveries WHERE consumer = ?`

	// The old name's dead letters of events that the new name has a dead
	// letter of too: the new name's is kept (see mergeDeadLetter).
	qDeadLetterConflicts = `SELECT o.id, n.id, o.repeats, o.first_failed_at
FROM {p}dead_letters o JOIN {p}dead_letters n
    ON n.consumer = ? AND n.source = o.source AND n.event_id = o.event_id
WHERE o.consumer = ? ORDER BY o.id`
	qMoveHistory      = `UPDATE {p}dead_letter_history SET dead_letter_id = ? WHERE dead_letter_id = ?`
	qMoveReplaysOfDL  = `UPDATE {p}replays SET dead_letter_id = ? WHERE dead_letter_id = ?`
	qMergeDeadLetters = `UPDATE {p}dead_letters SET repeats = repeats + ?,
    first_failed_at = CASE WHEN first_failed_at > ? THEN ? ELSE first_failed_at END
WHERE id = ?`
	qDropDeadLetter = `DELETE FROM {p}dead_letters WHERE id = ?`

	qAdoptedHistory = `INSERT INTO {p}dead_letter_history (dead_letter_id, at, kind, actor)
SELECT id, ?, 'adopted', ? FROM {p}dead_letters WHERE consumer = ?`
	qAdoptDeadLetters = `UPDATE {p}dead_letters SET consumer = ? WHERE consumer = ?`
	qAdoptReplays     = `UPDATE {p}replays SET consumer = ? WHERE consumer = ? AND sent_at IS NULL`

	// The waits behind a gap, the holds, the parked events and the skips
	// move too. Where the new name has a place of the same subject and
	// sequence, its own stays, unless it is a wait (no one's place, see
	// qOwnOrWait) and the old name's is not. An old name's parked event
	// whose place the new name's parking, hold or skip of another event
	// keeps is the only copy of its message: qAdoptConflicts finds those,
	// which become dead letters first (see conflictsToDeadLetters).
	qAdoptConflicts = `SELECT o.subject, o.seq, o.source, o.event_id, o.topic, o.body, o.metadata
FROM {p}parked_events o JOIN {p}parked_events n ON n.consumer = ? AND n.subject = o.subject AND n.seq = o.seq
WHERE o.consumer = ? AND o.reason = 'parked' AND n.reason <> 'gap'
    AND NOT (n.source = o.source AND n.event_id = o.event_id)
ORDER BY o.subject, o.seq`
	qAdoptParked = `INSERT INTO {p}parked_events (consumer, subject, seq, source, event_id, topic, body, metadata, parked_at, reason)
SELECT ?, subject, seq, source, event_id, topic, body, metadata, parked_at, reason FROM {p}parked_events WHERE consumer = ?
ON CONFLICT (consumer, subject, seq) DO UPDATE SET
    source = excluded.source, event_id = excluded.event_id, topic = excluded.topic, body = excluded.body,
    metadata = excluded.metadata, parked_at = excluded.parked_at, reason = excluded.reason
WHERE {p}parked_events.reason = 'gap' AND excluded.reason <> 'gap'`
	qDropParked = `DELETE FROM {p}parked_events WHERE consumer = ?`
)

var _ driver.Store = (*Store)(nil)

// Adopt implements driver.Store, in one transaction. The dead letters
// of the old name move to the new one, each with an adopted entry in its
// history (By is the old name). When both names have a dead letter of the
// same event, the new name's is kept: the old one's history joins it
// (before the adoption's entry, whose reason names the merged dead
// letter), its failures add to the repeats, the earlier first failure
// stays, and the old row is removed. The old name's unsent replays go to
// the new name.
func (s *Store) Adopt(ctx context.Context, consumer, from string) (int64, error) {
	if consumer == from {
		return 0, fmt.Errorf("adopt the marks of %s: a consumer cannot adopt its own name", from)
	}
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("adopt the marks of %s for %s: begin: %w", from, consumer, err)
	}
	defer tx.Rollback() // a no-op after Commit
	res, err := tx.ExecContext(ctx, s.q.sql(qAdoptProcessed), consumer, from)
	if err != nil {
		return 0, fmt.Errorf("adopt the marks of %s for %s: %w", from, consumer, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("adopt the marks of %s for %s: rows affected: %w", from, consumer, err)
	}
	if _, err := tx.ExecContext(ctx, s.q.sql(qAdoptCheckpoints), consumer, from); err != nil {
		return 0, fmt.Errorf("adopt the checkpoints of %s for %s: %w", from, consumer, err)
	}
	if err := s.conflictsToDeadLetters(ctx, tx, consumer, from); err != nil {
		return 0, fmt.Errorf("adopt the parked events of %s for %s: %w", from, consumer, err)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{qAdoptDeliveries, []any{consumer, from}},
		{qDropDeliveries, []any{from}},
		{qAdoptParked, []any{consumer, from}},
		{qDropParked, []any{from}},
	} {
		if _, err := tx.ExecContext(ctx, s.q.sql(q.sql), q.args...); err != nil {
			return 0, fmt.Errorf("adopt the delivery counts and parked events of %s for %s: %w", from, consumer, err)
		}
	}
	if err := s.adoptDeadLetters(ctx, tx, consumer, from); err != nil {
		return 0, fmt.Errorf("adopt the dead letters of %s for %s: %w", from, consumer, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("adopt the marks of %s for %s: commit: %w", from, consumer, err)
	}
	return n, nil
}

// conflictsToDeadLetters stores, inside tx, a dead letter of from
// (CodeSequenceConflict, holding nothing) of each parked event of from
// whose place consumer's parking, hold or skip of another event keeps, so
// that the adoption of the dead letters, which comes after, moves it to
// consumer: two events took one step of a subject, one under each name,
// and the one that loses it is a dead letter, as it is when both come to
// one name (see driver.ErrSequenceTaken).
func (s *Store) conflictsToDeadLetters(ctx context.Context, tx *sqlx.Tx, consumer, from string) error {
	var conflicts []parkedConflict
	if err := tx.SelectContext(ctx, &conflicts, s.q.sql(qAdoptConflicts), consumer, from); err != nil {
		return err
	}
	now := s.now()
	for _, c := range conflicts {
		p := driver.ParkedEvent{
			Consumer: from, Subject: c.Subject, Seq: c.Seq,
			Key: framework.Key{Source: c.Source, ID: c.EventID}, Topic: c.Topic, Body: c.Body,
		}
		dl := p.DeadLetter(framework.CodeSequenceConflict, now) // its metadata stays as stored: c.Metadata
		if err := s.insertDeadLetter(ctx, tx, dl, c.Metadata, s.dialect.timeArg(now)); err != nil {
			return fmt.Errorf("dead letter of %s parked at %s #%d: %w", p.Key, c.Subject, c.Seq, err)
		}
	}
	return nil
}

// parkedConflict is an old name's parked event that the new name's place
// keeps out (qAdoptConflicts).
type parkedConflict struct {
	Subject  string `db:"subject"`
	Seq      int64  `db:"seq"`
	Source   string `db:"source"`
	EventID  string `db:"event_id"`
	Topic    string `db:"topic"`
	Body     []byte `db:"body"`
	Metadata string `db:"metadata"`
}

// conflict is a dead letter of the old name (old) of an event that the new
// name has a dead letter of (kept).
type conflict struct {
	old, kept    int64
	repeats      int
	firstFailure timeValue
}

// adoptDeadLetters moves the dead letters and unsent replays of from to
// consumer inside tx.
func (s *Store) adoptDeadLetters(ctx context.Context, tx *sqlx.Tx, consumer, from string) error {
	conflicts, err := s.deadLetterConflicts(ctx, tx, consumer, from)
	if err != nil {
		return err
	}
	at := s.dialect.timeArg(s.now())
	for _, c := range conflicts {
		if err := s.mergeDeadLetter(ctx, tx, c, at, from); err != nil {
			return err
		}
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{qAdoptedHistory, []any{at, from, from}},
		{qAdoptDeadLetters, []any{consumer, from}},
		{qAdoptReplays, []any{consumer, from}},
	} {
		if _, err := tx.ExecContext(ctx, s.q.sql(q.sql), q.args...); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) deadLetterConflicts(ctx context.Context, tx *sqlx.Tx, consumer, from string) (_ []conflict, err error) {
	rows, err := tx.QueryContext(ctx, s.q.sql(qDeadLetterConflicts), consumer, from)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	var out []conflict
	for rows.Next() {
		var c conflict
		if err := rows.Scan(&c.old, &c.kept, &c.repeats, &c.firstFailure); err != nil {
			return nil, fmt.Errorf("scan: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// mergeDeadLetter folds the old name's dead letter c.old into c.kept:
// its history and replays, its failures (c.repeats+1 more repeats) and
// its first failure when earlier; then it records the adoption in the
// kept one's history and removes c.old.
func (s *Store) mergeDeadLetter(ctx context.Context, tx *sqlx.Tx, c conflict, at any, from string) error {
	first := s.dialect.timeArg(c.firstFailure.t)
	reason := fmt.Sprintf("merged dead letter %d of %s: this dead letter of the same event is kept", c.old, from)
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{qMoveHistory, []any{c.kept, c.old}},
		{qMoveReplaysOfDL, []any{c.kept, c.old}},
		{qMergeDeadLetters, []any{c.repeats + 1, first, first, c.kept}},
		{qAddHistory, []any{c.kept, at, string(driver.HistoryAdopted), "", 0, 0, from, reason}},
		{qDropDeadLetter, []any{c.old}},
	} {
		if _, err := tx.ExecContext(ctx, s.q.sql(q.sql), q.args...); err != nil {
			return fmt.Errorf("merge dead letter %d into %d: %w", c.old, c.kept, err)
		}
	}
	return nil
}
