package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/internal/crash"
)

// newOutbox returns the outbox of the application's database, whose
// table carries the configured prefix. Handlers take it as a dependency
// and call Add to publish events with their transaction's writes.
func newOutbox(db *sqlx.DB, cfg Config) (*outbox.Outbox, error) {
	box, err := outbox.New(db, outbox.Config{TablePrefix: cfg.TablePrefix})
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return box, nil
}

// outboxRelayParams are what newOutboxRelay takes from fx.
type outboxRelayParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	DB        *sqlx.DB
	Outbox    *outbox.Outbox
	Transport framework.Transport
	Registry  registry
	Tracer    trace.Tracer
	Logger    *slog.Logger `optional:"true"`
	// Crash is the crash tests' hook (see relayCrash), put on the relay's
	// context.
	Crash replayCrash `optional:"true"`
}

// newOutboxRelay returns the relay that publishes the outbox through the
// transport's publisher. It runs from the application's start, after the
// transport's, until its stop, before the transport's; an Add of the
// application's Outbox wakes it. It keeps the rows it sent: the purge
// deletes them (see purger).
func newOutboxRelay(p outboxRelayParams) (*outbox.Relay, error) {
	logger := orDefault(p.Logger)
	metrics, err := outbox.NewMetrics(p.Registry)
	if err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	relay, err := outbox.NewRelay(p.DB, p.Transport.Publisher(), outbox.RelayConfig{
		TablePrefix:  p.Config.TablePrefix,
		Outbox:       p.Outbox,
		BatchTimeout: time.Duration(p.Config.OutboxBatchTimeout),
		BatchSize:    p.Config.OutboxBatchSize,
		BatchBytes:   p.Config.OutboxBatchBytes,
		Metrics:      metrics,
		Logger:       logger.With("component", "outbox"),
		// A span per publish (see newTracer).
		Tracer:          p.Tracer,
		MessagingSystem: messagingSystem(p.Config.Transport),
		// The service's purge deletes the sent rows (outbox_retention).
		Retention: -1,
	})
	if err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	runInBackground(p.Lifecycle, "outbox relay", func(ctx context.Context) {
		if p.Crash.hook != nil {
			ctx = crash.With(ctx, p.Crash.hook)
		}
		_ = relay.Run(ctx) // nil when ctx ends; ErrRunning cannot happen here
	})
	return relay, nil
}
