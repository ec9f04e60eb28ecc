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

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// The SQL of the operator's views (driver.Inspector). Each reads
// through an index: the outbox's unique (source, event_id), the dead
// letters' (source, event_id), the marks' primary key (consumer, source,
// event_id) per consumer, the marks' processed_at, the dead letters'
// (status, id) and the outbox's unsent rows.
const (
	qInspectOutbox = `SELECT id, type, subject, subject_seq, created_at, sent_at
FROM {p}outbox WHERE source = ? AND event_id = ?`

	// qInspectMarks finds the consumers that have marks (a loose index
	// scan of the primary key: one seek per consumer), then each one's
	// mark of the event.
	qInspectMarks = `WITH RECURSIVE c (consumer) AS (
    SELECT MIN(consumer) FROM {p}processed_events
    UNION ALL
    SELECT (SELECT MIN(n.consumer) FROM {p}processed_events n WHERE n.consumer > c.consumer)
    FROM c WHERE c.consumer IS NOT NULL
)
SELECT p.consumer, p.processed_at FROM c
JOIN {p}processed_events p ON p.consumer = c.consumer AND p.source = ? AND p.event_id = ?
ORDER BY p.consumer`

	qInspectParked = `SELECT p.consumer, p.subject, p.seq, p.parked_at, p.reason, COALESCE(c.seq, 0)
FROM {p}parked_events p LEFT JOIN {p}subject_checkpoints c ON c.consumer = p.consumer AND c.subject = p.subject
WHERE p.reason IN ('dead_letter', 'parked') AND p.source = ? AND p.event_id = ?
ORDER BY p.consumer, p.subject, p.seq`

	qProcessedSince = `SELECT consumer, COUNT(*) FROM {p}processed_events WHERE processed_at >= ? GROUP BY consumer`
	qPendingCounts  = `SELECT consumer, COUNT(*) FROM {p}dead_letters WHERE status = 'pending' GROUP BY consumer`
	qParkedCounts   = `SELECT consumer, COUNT(*) FROM {p}parked_events WHERE reason = 'parked' GROUP BY consumer`
	qUnsentOutbox   = `SELECT COUNT(*), MIN(created_at) FROM {p}outbox WHERE sent_at IS NULL`
)

// inspectDeadLetterLimit bounds the dead letters of one event: one per
// consumer.
const inspectDeadLetterLimit = 1000

var _ driver.Inspector = (*Store)(nil)

// InspectEvent implements driver.Inspector.
func (s *Store) InspectEvent(ctx context.Context, key framework.Key) (driver.EventRecord, error) {
	rec := driver.EventRecord{Key: key}
	var err error
	if !storableText(key.Source, key.ID) {
		// No row holds it (PostgreSQL would refuse the query): only the
		// horizons to tell.
		if rec.Horizons, err = s.horizons().Read(ctx, s.db); err != nil {
			return rec, fmt.Errorf("inspect event: %w", err)
		}
		return rec, nil
	}
	if rec.Outbox, err = s.inspectOutbox(ctx, key); err != nil {
		return rec, fmt.Errorf("inspect event %s: %w", key, err)
	}
	if rec.Processed, err = s.inspectMarks(ctx, key); err != nil {
		return rec, fmt.Errorf("inspect event %s: %w", key, err)
	}
	if rec.DeadLetters, err = s.inspectDeadLetters(ctx, key); err != nil {
		return rec, fmt.Errorf("inspect event %s: %w", key, err)
	}
	if rec.Parked, err = s.inspectParked(ctx, key); err != nil {
		return rec, fmt.Errorf("inspect event %s: %w", key, err)
	}
	if rec.Horizons, err = s.horizons().Read(ctx, s.db); err != nil {
		return rec, fmt.Errorf("inspect event %s: %w", key, err)
	}
	return rec, nil
}

func (s *Store) inspectOutbox(ctx context.Context, key framework.Key) (*driver.OutboxRecord, error) {
	var (
		o             driver.OutboxRecord
		created, sent timeValue
	)
	err := s.db.QueryRowxContext(ctx, s.q.sql(qInspectOutbox), key.Source, key.ID).
		Scan(&o.ID, &o.Type, &o.Subject, &o.SubjectSeq, &created, &sent)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("outbox row: %w", err)
	}
	o.CreatedAt, o.SentAt = created.t, sent.t
	return &o, nil
}

func (s *Store) inspectMarks(ctx context.Context, key framework.Key) (_ []driver.ProcessedMark, err error) {
	rows, err := s.db.QueryxContext(ctx, s.q.sql(qInspectMarks), key.Source, key.ID)
	if err != nil {
		return nil, fmt.Errorf("processed marks: %w", err)
	}
	defer closeRows(rows, &err)
	var out []driver.ProcessedMark
	for rows.Next() {
		var (
			m  driver.ProcessedMark
			at timeValue
		)
		if err := rows.Scan(&m.Consumer, &at); err != nil {
			return nil, fmt.Errorf("processed marks: %w", err)
		}
		m.At = at.t
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("processed marks: %w", err)
	}
	return out, nil
}

// inspectDeadLetters returns the dead letters of key, each with its
// history.
func (s *Store) inspectDeadLetters(ctx context.Context, key framework.Key) ([]driver.DeadLetterRecord, error) {
	dls, err := s.DeadLetters(ctx, driver.DeadLetterFilter{Source: key.Source, EventID: key.ID, Limit: inspectDeadLetterLimit})
	if err != nil {
		return nil, err
	}
	var out []driver.DeadLetterRecord
	for _, dl := range dls {
		if dl.Key() != key {
			continue // an empty Source filters nothing
		}
		h, err := s.DeadLetterHistory(ctx, dl.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, driver.DeadLetterRecord{DeadLetter: dl, History: h})
	}
	return out, nil
}

func (s *Store) inspectParked(ctx context.Context, key framework.Key) (_ []driver.ParkedEvent, err error) {
	rows, err := s.db.QueryxContext(ctx, s.q.sql(qInspectParked), key.Source, key.ID)
	if err != nil {
		return nil, fmt.Errorf("parked events: %w", err)
	}
	defer closeRows(rows, &err)
	var out []driver.ParkedEvent
	for rows.Next() {
		var (
			p          = driver.ParkedEvent{Key: key}
			at         timeValue
			reason     string
			checkpoint int64
		)
		if err := rows.Scan(&p.Consumer, &p.Subject, &p.Seq, &at, &reason, &checkpoint); err != nil {
			return nil, fmt.Errorf("parked events: %w", err)
		}
		p.At = at.t
		p.Held = reason == "dead_letter"
		p.Ready = !p.Held && p.Seq == checkpoint+1
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("parked events: %w", err)
	}
	return out, nil
}

// InspectConsumers implements driver.Inspector.
func (s *Store) InspectConsumers(ctx context.Context, since time.Time) (driver.ConsumersRecord, error) {
	var rec driver.ConsumersRecord
	figures := make(map[string]*driver.ConsumerFigures)
	for _, c := range []struct {
		what  string
		query string
		args  []any
		field func(f *driver.ConsumerFigures) *int64
	}{
		{"processed marks", qProcessedSince, []any{s.dialect.timeArg(since)}, func(f *driver.ConsumerFigures) *int64 { return &f.Processed }},
		{"pending dead letters", qPendingCounts, nil, func(f *driver.ConsumerFigures) *int64 { return &f.PendingDeadLetters }},
		{"parked events", qParkedCounts, nil, func(f *driver.ConsumerFigures) *int64 { return &f.Parked }},
	} {
		if err := s.countPerConsumer(ctx, c.query, c.args, func(consumer string, n int64) {
			f := figures[consumer]
			if f == nil {
				f = &driver.ConsumerFigures{Consumer: consumer}
				figures[consumer] = f
			}
			*c.field(f) = n
		}); err != nil {
			return rec, fmt.Errorf("inspect consumers: %s: %w", c.what, err)
		}
	}
	for _, f := range figures {
		rec.Consumers = append(rec.Consumers, *f)
	}
	slices.SortFunc(rec.Consumers, func(a, b driver.ConsumerFigures) int { return strings.Compare(a.Consumer, b.Consumer) })
	var oldest timeValue
	if err := s.db.QueryRowxContext(ctx, s.q.sql(qUnsentOutbox)).Scan(&rec.Unsent, &oldest); err != nil {
		return rec, fmt.Errorf("inspect consumers: unsent outbox rows: %w", err)
	}
	rec.OldestUnsent = oldest.t
	return rec, nil
}

// countPerConsumer runs query, whose rows are (consumer, count), and
// hands each row to add.
func (s *Store) countPerConsumer(ctx context.Context, query string, args []any, add func(consumer string, n int64)) (err error) {
	rows, err := s.db.QueryxContext(ctx, s.q.sql(query), args...)
	if err != nil {
		return err
	}
	defer closeRows(rows, &err)
	for rows.Next() {
		var (
			consumer string
			n        int64
		)
		if err := rows.Scan(&consumer, &n); err != nil {
			return err
		}
		add(consumer, n)
	}
	return rows.Err()
}

// closeRows closes rows, and sets *err to the close's error when it was
// nil.
func closeRows(rows *sqlx.Rows, err *error) {
	if cerr := rows.Close(); *err == nil && cerr != nil {
		*err = cerr
	}
}
