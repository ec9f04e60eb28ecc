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

// Purger deletes processed marks older than Config.ProcessedRetention, every
// Config.PurgeInterval, while the application runs. With no retention it
// does nothing.
type Purger struct {
	store  framework.Store
	cfg    Config
	logger *slog.Logger
}

// PurgerParams are what NewPurger takes from fx.
type PurgerParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	Store     Store
	Logger    *slog.Logger `optional:"true"`
}

// NewPurger returns the purger and runs it from the application's start
// to its stop.
func NewPurger(p PurgerParams) *Purger {
	logger := orDefault(p.Logger)
	pu := &Purger{store: p.Store, cfg: p.Config, logger: logger.With("component", "purger")}
	if p.Config.ProcessedRetention <= 0 {
		return pu
	}
	runInBackground(p.Lifecycle, "purger", pu.run)
	return pu
}

func (pu *Purger) run(ctx context.Context) {
	tick := time.NewTicker(time.Duration(pu.cfg.PurgeInterval))
	defer tick.Stop()
	for {
		if n, err := pu.Purge(ctx); err != nil && ctx.Err() == nil {
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

// Purge deletes, in batches, the marks processed longer than the retention
// ago, and returns how many it deleted.
func (pu *Purger) Purge(ctx context.Context) (int64, error) {
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
