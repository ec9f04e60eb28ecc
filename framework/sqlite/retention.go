package sqlite

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/framework"
)

var (
	_ framework.Purger = (*Store)(nil)
	_ framework.Gauges = (*Store)(nil)
)

// PurgeBatch deletes up to limit rows of kind older than before, in one
// transaction that records the kind's purge horizon (framework.Purger).
func (s *Store) PurgeBatch(ctx context.Context, kind framework.PurgeKind, before time.Time, limit int) (int64, error) {
	return s.sql.PurgeBatch(ctx, kind, before, limit)
}

// Purgeable counts the rows PurgeBatch would delete (framework.Purger).
func (s *Store) Purgeable(ctx context.Context, kind framework.PurgeKind, before time.Time) (int64, error) {
	return s.sql.Purgeable(ctx, kind, before)
}

// AcquireLease takes or renews the lease name for holder, a row of the
// table leases (framework.Purger).
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	return s.sql.AcquireLease(ctx, name, holder, ttl)
}

// ReleaseLease ends holder's lease name (framework.Purger).
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) error {
	return s.sql.ReleaseLease(ctx, name, holder)
}

// Figures counts the pending dead letters by consumer and code and the
// parked events by consumer (framework.Gauges).
func (s *Store) Figures(ctx context.Context) (framework.Figures, error) {
	return s.sql.Figures(ctx)
}
