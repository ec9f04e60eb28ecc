package postgres

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/framework"
)

var _ framework.Inspector = (*Store)(nil)

// InspectEvent returns what the database knows of the event key: its
// outbox row, the processed marks, its dead letters with their history,
// its holds and parkings, and the purge horizons (framework.Inspector).
func (s *Store) InspectEvent(ctx context.Context, key framework.Key) (framework.EventRecord, error) {
	return s.sql.InspectEvent(ctx, key)
}

// InspectConsumers returns, per consumer, the marks processed since
// since, the pending dead letters and the parked events, and the outbox's
// unsent rows (framework.Inspector).
func (s *Store) InspectConsumers(ctx context.Context, since time.Time) (framework.ConsumersRecord, error) {
	return s.sql.InspectConsumers(ctx, since)
}
