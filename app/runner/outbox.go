package runner

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/framework/outbox"
)

// newOutboxRelay returns the relay of cfg.OutboxRelay, publishing through
// the transport's publisher; nil without an outbox. While the runner
// purges, the purge deletes the sent rows (OutboxRetention): the relay
// keeps them.
func newOutboxRelay(cfg Config, purges bool) (*outbox.Relay, error) {
	rc := cfg.OutboxRelay
	if rc.Outbox == nil {
		return nil, nil
	}
	if rc.Logger == nil {
		rc.Logger = cfg.Logger.With("component", "outbox")
	}
	if rc.Tracer == nil && cfg.Tracer != nil {
		rc.Tracer = cfg.Tracer
	}
	if purges {
		rc.Retention = -1
	}
	relay, err := outbox.NewRelay(cfg.DB, cfg.Transport.Publisher(), rc)
	if err != nil {
		return nil, fmt.Errorf("Config.OutboxRelay: %w", err)
	}
	return relay, nil
}

// lastOutboxPass publishes, once the relay stopped, what the consumers
// committed to the outbox while they drained, within ctx. What it leaves
// stays in the outbox table: the next start publishes it.
func (r *Runner) lastOutboxPass(ctx context.Context) {
	if r.relay == nil || ctx.Err() != nil {
		return
	}
	n, err := r.relay.PublishUnsent(ctx)
	switch {
	case err != nil:
		r.logger.WarnContext(ctx, "outbox relay: last pass at stop failed; the next start publishes the rest", "error", err, "published", n)
	case n > 0:
		r.logger.InfoContext(ctx, "outbox relay: published at stop what the consumers committed while draining", "published", n)
	}
}
