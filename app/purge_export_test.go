package app

import (
	"context"

	"github.com/effectively-once/effectively/app/internal/purge"
	"github.com/effectively-once/effectively/framework/driver"
)

// ErrPurgeBusy is purge.ErrBusy, for the tests.
var ErrPurgeBusy = purge.ErrBusy

// PurgeOnce runs one purge of store with cfg's retentions, as the service
// and the purge command do, and returns the rows deleted by kind.
func PurgeOnce(ctx context.Context, store driver.Store, cfg Config) (map[driver.PurgeKind]int64, error) {
	return NewPurge(store, cfg)(ctx)
}

// NewPurge returns a function that runs a purge of store with cfg's
// retentions each time it is called, as one process of the service does:
// the purges hold the lease under one holder, so that a lease one of them
// failed to release is renewed by the next.
func NewPurge(store driver.Store, cfg Config) func(context.Context) (map[driver.PurgeKind]int64, error) {
	pu := purge.New(store, retentions(cfg.WithDefaults()), orDefault(nil))
	return func(ctx context.Context) (map[driver.PurgeKind]int64, error) {
		steps, err := pu.Purge(ctx)
		rows := make(map[driver.PurgeKind]int64, len(steps))
		for _, s := range steps {
			rows[s.Kind] += s.Rows
		}
		return rows, err
	}
}
