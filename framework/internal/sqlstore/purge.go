package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
)

const (
	// qPurgeProcessed deletes a batch of the oldest marks processed
	// before a time, through the index on processed_at.
	qPurgeProcessed = `DELETE FROM {p}processed_events WHERE (consumer, source, event_id) IN (
SELECT consumer, source, event_id FROM {p}processed_events WHERE processed_at < ? ORDER BY processed_at LIMIT ?)`

	// qRecordHorizon records how far a purge deleted; a horizon never
	// moves back.
	qRecordHorizon = `INSERT INTO {p}purge_horizons (kind, purged_before) VALUES (?, ?)
ON CONFLICT (kind) DO UPDATE SET purged_before = CASE
    WHEN excluded.purged_before > {p}purge_horizons.purged_before THEN excluded.purged_before
    ELSE {p}purge_horizons.purged_before END`

	qHorizons = `SELECT kind, purged_before FROM {p}purge_horizons`
)

var _ driver.Store = (*Store)(nil)

// PurgeProcessed implements driver.Store: one transaction, which also
// records, when it deleted any mark, that marks processed before before
// may be gone (driver.PurgeHorizons).
func (s *Store) PurgeProcessed(ctx context.Context, before time.Time, limit int) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		res, err := tx.ExecContext(ctx, s.q.sql(qPurgeProcessed), s.dialect.timeArg(before), limit)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return fmt.Errorf("rows affected: %w", err)
		}
		if n == 0 {
			return nil
		}
		return s.horizons().Record(ctx, tx, driver.PurgeProcessed, before)
	}, "purge marks processed before %s", before.UTC().Format(time.RFC3339))
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Horizons records how far the purges deleted, in the table
// purge_horizons, and reads it back (see driver.PurgeHorizons).
type Horizons struct {
	dialect      Dialect
	record, read string
}

// horizons returns the store's purge horizons.
func (s *Store) horizons() *Horizons {
	return &Horizons{dialect: s.dialect, record: s.q.sql(qRecordHorizon), read: s.q.sql(qHorizons)}
}

// NewHorizons returns the purge horizons of d on tables prefixed with
// prefix.
func NewHorizons(d Dialect, prefix string) (*Horizons, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	if err := ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	q := newQueries(d, prefix)
	return &Horizons{dialect: d, record: q.sql(qRecordHorizon), read: q.sql(qHorizons)}, nil
}

// Record records in ex, the purge's transaction, that the rows of kind
// older than before may be gone. An earlier horizon that reaches further
// is kept.
func (h *Horizons) Record(ctx context.Context, ex sqlx.ExecerContext, kind driver.PurgeKind, before time.Time) error {
	if kind == "" {
		return errors.New("record purge horizon: empty kind")
	}
	if _, err := ex.ExecContext(ctx, h.record, string(kind), h.dialect.timeArg(before)); err != nil {
		return fmt.Errorf("record purge horizon of %s: %w", kind, err)
	}
	return nil
}

// Read returns the horizons recorded in q.
func (h *Horizons) Read(ctx context.Context, q sqlx.QueryerContext) (_ driver.PurgeHorizons, err error) {
	var hs driver.PurgeHorizons
	rows, err := q.QueryxContext(ctx, h.read)
	if err != nil {
		return hs, fmt.Errorf("read purge horizons: %w", err)
	}
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("read purge horizons: %w", cerr)
		}
	}()
	for rows.Next() {
		var (
			kind string
			at   timeValue
		)
		if err := rows.Scan(&kind, &at); err != nil {
			return hs, fmt.Errorf("read purge horizons: %w", err)
		}
		switch driver.PurgeKind(kind) {
		case driver.PurgeProcessed:
			hs.Processed = at.t
		case driver.PurgeOutbox:
			hs.Outbox = at.t
		case driver.PurgeDeadLetters:
			hs.DeadLetters = at.t
		}
	}
	if err := rows.Err(); err != nil {
		return hs, fmt.Errorf("read purge horizons: %w", err)
	}
	return hs, nil
}
