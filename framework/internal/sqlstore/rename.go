package sqlstore

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/framework"
)

// The SQL of a consumer's rename: the new name adopts the processed marks
// and the subject checkpoints of the old one. Marks the new name has are
// kept; a checkpoint keeps the higher sequence.
const (
	qAdoptProcessed = `INSERT INTO {p}processed_events (consumer, source, event_id, processed_at)
SELECT ?, source, event_id, processed_at FROM {p}processed_events WHERE consumer = ?
ON CONFLICT (consumer, source, event_id) DO NOTHING`

	qAdoptCheckpoints = `INSERT INTO {p}subject_checkpoints (consumer, subject, seq)
SELECT ?, subject, seq FROM {p}subject_checkpoints WHERE consumer = ?
ON CONFLICT (consumer, subject) DO UPDATE SET seq = excluded.seq
WHERE {p}subject_checkpoints.seq < excluded.seq`
)

var _ framework.Store = (*Store)(nil)

// Adopt implements framework.Store, in one transaction.
func (s *Store) Adopt(ctx context.Context, consumer, from string) (int64, error) {
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
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("adopt the marks of %s for %s: commit: %w", from, consumer, err)
	}
	return n, nil
}
