package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/framework"
)

// qPurgeProcessed deletes a batch of the oldest marks processed before a
// time, through the index on processed_at.
const qPurgeProcessed = `DELETE FROM {p}processed_events WHERE (consumer, source, event_id) IN (
SELECT consumer, source, event_id FROM {p}processed_events WHERE processed_at < ? ORDER BY processed_at LIMIT ?)`

var _ framework.Store = (*Store)(nil)

// PurgeProcessed implements framework.Store: one statement, committed
// on its own.
func (s *Store) PurgeProcessed(ctx context.Context, before time.Time, limit int) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.q.sql(qPurgeProcessed), s.dialect.timeArg(before), limit)
	if err != nil {
		return 0, fmt.Errorf("purge marks processed before %s: %w", before.Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge marks: rows affected: %w", err)
	}
	return n, nil
}
