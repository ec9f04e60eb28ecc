package runner

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/effectively-once/effectively/app/internal/purge"
)

// runPurge purges what is past its retention at once and then every
// interval, until ctx ends. While another process of the service holds
// the purge's lease, it skips its turn.
func runPurge(ctx context.Context, pu *purge.Purger, interval time.Duration, logger *slog.Logger) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		steps, err := pu.Purge(ctx)
		switch {
		case errors.Is(err, purge.ErrBusy):
			logger.DebugContext(ctx, "purge skipped: another process purges")
		case err != nil && ctx.Err() == nil:
			logger.ErrorContext(ctx, "purge failed; trying again at the next interval", "error", err)
		}
		if attrs := purge.Attrs(steps); len(attrs) > 0 {
			logger.InfoContext(ctx, "purged", attrs...)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// topics returns the topics the consumers subscribed to, each once, in
// order.
func (r *Runner) topics() []string {
	var out []string
	seen := make(map[string]bool)
	for _, s := range r.subs {
		for _, topic := range s.sub.Topics {
			if !seen[topic] {
				seen[topic] = true
				out = append(out, topic)
			}
		}
	}
	return out
}
