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
	steps, err := purge.New(store, retentions(cfg.WithDefaults()), orDefault(nil)).Purge(ctx)
	rows := make(map[driver.PurgeKind]int64, len(steps))
	for _, s := range steps {
		rows[s.Kind] += s.Rows
	}
	return rows, err
}
