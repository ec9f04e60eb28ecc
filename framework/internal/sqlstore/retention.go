package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// The SQL of the purges past retention (driver.Purger) and of the
// gauges (driver.Gauges). Each purge statement deletes a batch chosen
// by a subquery with a LIMIT, so that a transaction stays short.
const (
	// deliveriesFinished says which delivery counts belong to messages
	// that finished: first counted before a time (?), or whose event the
	// consumer marked processed, or stored as a dead letter since the
	// count began and not replayed after. A count that began after its
	// dead letter was stored (the message came back and fails again), or
	// whose dead letter was replayed, is the count of a message that may
	// still be failing: it stays.
	deliveriesFinished = `(d.first_at < ?
    OR EXISTS (SELECT 1 FROM {p}processed_events p
        WHERE p.consumer = d.consumer AND p.source = d.source AND p.event_id = d.event_id)
    OR EXISTS (SELECT 1 FROM {p}dead_letters l
        WHERE l.consumer = d.consumer AND l.source = d.source AND l.event_id = d.event_id
          AND l.status <> 'replayed' AND d.first_at <= l.last_failed_at))`

	qPurgeDeliveries = `DELETE FROM {p}deliveries WHERE (consumer, source, event_id) IN (
SELECT d.consumer, d.source, d.event_id FROM {p}deliveries d WHERE ` + deliveriesFinished + ` LIMIT ?)`
	qCountDeliveries = `SELECT COUNT(*) FROM {p}deliveries d WHERE ` + deliveriesFinished

	// qPurgeReplays, like the outbox's cleanup (qOutboxCleanup), reads
	// the sent rows through the index on their sent_at.
	qPurgeReplays = `DELETE FROM {p}replays WHERE id IN (
SELECT id FROM {p}replays WHERE sent_at IS NOT NULL AND sent_at < ? ORDER BY sent_at LIMIT ?)`
	qCountReplays = `SELECT COUNT(*) FROM {p}replays WHERE sent_at IS NOT NULL AND sent_at < ?`

	// qPurgeDeadLetters checks the status again in the outer statement: a
	// repeat that made the dead letter pending again meanwhile keeps it.
	// A replayed dead letter whose replay is not published yet stays
	// (purgeableDeadLetter): should the replay fail again, its failure
	// joins the row and its history instead of starting a new one.
	qPurgeDeadLetters = `DELETE FROM {p}dead_letters WHERE id IN (
SELECT id FROM {p}dead_letters WHERE ` + purgeableDeadLetter + ` ORDER BY resolved_at LIMIT ?)
AND status <> 'pending' RETURNING id`
	qCountDeadLetters = `SELECT COUNT(*) FROM {p}dead_letters WHERE ` + purgeableDeadLetter
	// purgeableDeadLetter is the condition of a dead letter resolved
	// before ?, whose replay, if any, was published: the unsent replays
	// are few, read through their partial index.
	purgeableDeadLetter = `status <> 'pending' AND resolved_at < ? AND id NOT IN (
SELECT dead_letter_id FROM {p}replays WHERE sent_at IS NULL)`
	// qPurgeDeadLetterHistory deletes the history of the dead letters
	// purged.
	qPurgeDeadLetterHistory = `DELETE FROM {p}dead_letter_history WHERE dead_letter_id ` + inIDs

	qCountProcessed = `SELECT COUNT(*) FROM {p}processed_events WHERE processed_at < ?`
	qCountOutbox    = `SELECT COUNT(*) FROM {p}outbox WHERE sent_at IS NOT NULL AND sent_at < ?`

	// qAcquireLease takes a lease nobody holds, or whose time ended, and
	// renews the holder's own: it changes no row when another holds it.
	qAcquireLease = `INSERT INTO {p}leases (name, holder, expires_at) VALUES (?, ?, ?)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE {p}leases.holder = excluded.holder OR {p}leases.expires_at < ?`
	qReleaseLease = `DELETE FROM {p}leases WHERE name = ? AND holder = ?`

	qPendingByCode = `SELECT consumer, code, COUNT(*) AS count FROM {p}dead_letters WHERE status = 'pending' GROUP BY consumer, code ORDER BY consumer, code`
	qParkedByName  = `SELECT consumer, COUNT(*) AS count FROM {p}parked_events WHERE reason = 'parked' GROUP BY consumer ORDER BY consumer`
)

var (
	_ driver.Purger = (*Store)(nil)
	_ driver.Gauges = (*Store)(nil)
)

// sinceEver is the time a purge of delivery counts gives for "no time":
// only the counts of messages that finished go.
var sinceEver = time.Unix(0, 0)

// PurgeBatch implements driver.Purger.
func (s *Store) PurgeBatch(ctx context.Context, kind driver.PurgeKind, before time.Time, limit int) (int64, error) {
	switch kind {
	case driver.PurgeProcessed:
		return s.PurgeProcessed(ctx, before, limit)
	case driver.PurgeDeliveries:
		if before.IsZero() {
			before = sinceEver
		}
		return s.purgeBatch(ctx, kind, before, func(tx *sqlx.Tx) (int64, error) {
			return rowsAffected(tx.ExecContext(ctx, s.q.sql(qPurgeDeliveries), s.dialect.timeArg(before), limit))
		})
	case driver.PurgeOutbox:
		return s.purgeBatch(ctx, kind, before, func(tx *sqlx.Tx) (int64, error) {
			return rowsAffected(tx.ExecContext(ctx, s.q.sql(qOutboxCleanup), s.dialect.timeArg(before), limit))
		})
	case driver.PurgeReplays:
		return s.purgeBatch(ctx, kind, before, func(tx *sqlx.Tx) (int64, error) {
			return rowsAffected(tx.ExecContext(ctx, s.q.sql(qPurgeReplays), s.dialect.timeArg(before), limit))
		})
	case driver.PurgeDeadLetters:
		return s.purgeBatch(ctx, kind, before, func(tx *sqlx.Tx) (int64, error) {
			return s.purgeDeadLetters(ctx, tx, before, limit)
		})
	}
	return 0, fmt.Errorf("purge: unknown kind %q", kind)
}

// purgeBatch runs del in a transaction that also records the horizon of
// kind when del deleted rows (the delivery counts have none).
func (s *Store) purgeBatch(ctx context.Context, kind driver.PurgeKind, before time.Time, del func(tx *sqlx.Tx) (int64, error)) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		var err error
		if n, err = del(tx); err != nil || n == 0 || kind == driver.PurgeDeliveries {
			return err
		}
		return s.horizons().Record(ctx, tx, kind, before)
	}, "purge %s before %s", kind, before.UTC().Format(time.RFC3339))
	if err != nil {
		return 0, err
	}
	return n, nil
}

// purgeDeadLetters deletes a batch of resolved dead letters and their
// history in tx.
func (s *Store) purgeDeadLetters(ctx context.Context, tx *sqlx.Tx, before time.Time, limit int) (int64, error) {
	var ids []int64
	if err := tx.SelectContext(ctx, &ids, s.q.sql(qPurgeDeadLetters), s.dialect.timeArg(before), limit); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if _, err := tx.ExecContext(ctx, s.q.sql(s.dialect.withIDList(qPurgeDeadLetterHistory)), s.dialect.idList(ids)); err != nil {
		return 0, fmt.Errorf("history: %w", err)
	}
	return int64(len(ids)), nil
}

// Purgeable implements driver.Purger.
func (s *Store) Purgeable(ctx context.Context, kind driver.PurgeKind, before time.Time) (int64, error) {
	var q string
	switch kind {
	case driver.PurgeProcessed:
		q = qCountProcessed
	case driver.PurgeDeliveries:
		q = qCountDeliveries
		if before.IsZero() {
			before = sinceEver
		}
	case driver.PurgeOutbox:
		q = qCountOutbox
	case driver.PurgeReplays:
		q = qCountReplays
	case driver.PurgeDeadLetters:
		q = qCountDeadLetters
	default:
		return 0, fmt.Errorf("count what a purge deletes: unknown kind %q", kind)
	}
	var n int64
	if err := s.db.GetContext(ctx, &n, s.q.sql(q), s.dialect.timeArg(before)); err != nil {
		return 0, fmt.Errorf("count the %s a purge deletes: %w", kind, err)
	}
	return n, nil
}

// AcquireLease implements driver.Purger.
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	now := s.now()
	n, err := rowsAffected(s.exec(ctx, s.q.sql(qAcquireLease), name, holder, s.dialect.timeArg(now.Add(ttl)), s.dialect.timeArg(now)))
	if err != nil {
		return false, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	return n == 1, nil
}

// ReleaseLease implements driver.Purger.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) error {
	if _, err := s.exec(ctx, s.q.sql(qReleaseLease), name, holder); err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	return nil
}

// Figures implements driver.Gauges.
func (s *Store) Figures(ctx context.Context) (driver.Figures, error) {
	var (
		f       driver.Figures
		pending []struct {
			Consumer string `db:"consumer"`
			Code     string `db:"code"`
			Count    int64  `db:"count"`
		}
		parked []struct {
			Consumer string `db:"consumer"`
			Count    int64  `db:"count"`
		}
	)
	if err := s.db.SelectContext(ctx, &pending, s.q.sql(qPendingByCode)); err != nil {
		return f, fmt.Errorf("count pending dead letters: %w", err)
	}
	if err := s.db.SelectContext(ctx, &parked, s.q.sql(qParkedByName)); err != nil {
		return f, fmt.Errorf("count parked events: %w", err)
	}
	for _, p := range pending {
		f.PendingDeadLetters = append(f.PendingDeadLetters, driver.PendingCount{Consumer: p.Consumer, Code: framework.Code(p.Code), Count: p.Count})
	}
	for _, p := range parked {
		f.Parked = append(f.Parked, driver.ParkedCount{Consumer: p.Consumer, Count: p.Count})
	}
	return f, nil
}

// rowsAffected returns the rows an Exec changed.
func rowsAffected(res interface{ RowsAffected() (int64, error) }, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("rows affected: %w", err)
	}
	return n, nil
}
