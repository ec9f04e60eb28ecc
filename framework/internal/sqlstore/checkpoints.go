package sqlstore

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/framework/driver"
)

// qAdvance inserts the first checkpoint of a subject or raises it; the
// WHERE of the upsert leaves a checkpoint at or past seq alone, so no row
// is affected. On PostgreSQL a concurrent upsert of the same subject waits
// for the first transaction to end; on SQLite the attempt holds the write
// lock.
const qAdvance = `INSERT INTO {p}subject_checkpoints (consumer, subject, seq) VALUES (?, ?, ?)
ON CONFLICT (consumer, subject) DO UPDATE SET seq = excluded.seq
WHERE {p}subject_checkpoints.seq < excluded.seq`

var _ driver.Store = (*Store)(nil)

// Advance implements driver.Store.
func (s *Store) Advance(ctx context.Context, tx *driver.Tx, consumer, subject string, seq int64) (bool, error) {
	if !tx.HasDB() {
		return false, fmt.Errorf("advance checkpoint of %s for %s: %w", subject, consumer, ErrNoTx)
	}
	res, err := tx.ExecContext(ctx, s.q.sql(qAdvance), consumer, subject, seq)
	if err != nil {
		return false, fmt.Errorf("advance checkpoint of %s for %s to %d: %w", subject, consumer, seq, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("advance checkpoint of %s for %s: rows affected: %w", subject, consumer, err)
	}
	return n == 1, nil
}
