package app

import (
	"context"
	"log/slog"
	"time"

	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
)

// purgeBatch is how many marks one purge statement deletes.
const purgeBatch = 1000

// purger deletes processed marks older than Config.ProcessedRetention, every
// Config.PurgeInterval, while the application runs. With no retention it
// does nothing.
type purger struct {
	store  framework.Store
	cfg    Config
	logger *slog.Logger
}

// purgerParams are what newPurger takes from fx.
type purgerParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	Store     framework.Store
	Logger    *slog.Logger `optional:"true"`
}

// newPurger returns the purger and runs it from the application's start
// to its stop.
func newPurger(p purgerParams) *purger {
	logger := orDefault(p.Logger)
	pu := &purger{store: p.Store, cfg: p.Config, logger: logger.With("component", "purger")}
	if p.Config.ProcessedRetention <= 0 {
		return pu
	}
	runInBackground(p.Lifecycle, "purger", pu.run)
	return pu
}

func (pu *purger) run(ctx context.Context) {
	tick := time.NewTicker(time.Duration(pu.cfg.PurgeInterval))
	defer tick.Stop()
	for {
		if n, err := pu.purge(ctx); err != nil && ctx.Err() == nil {
			pu.logger.ErrorContext(ctx, "purge of old processed marks failed; trying again at the next interval", "error", err, "purged", n)
		} else if n > 0 {
			pu.logger.InfoContext(ctx, "purged old processed marks", "purged", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// purge deletes, in batches, the marks processed longer than the retention
// ago, and returns how many it deleted.
func (pu *purger) purge(ctx context.Context) (int64, error) {
	if pu.cfg.ProcessedRetention <= 0 {
		return 0, nil
	}
	before := time.Now().Add(-time.Duration(pu.cfg.ProcessedRetention))
	var total int64
	for ctx.Err() == nil {
		n, err := pu.store.PurgeProcessed(ctx, before, purgeBatch)
		total += n
		if err != nil || n < purgeBatch {
			return total, err
		}
	}
	return total, ctx.Err()
}
