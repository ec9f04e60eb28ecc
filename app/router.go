package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/middleware"
)

// Middleware is the application's own middleware around every consumer's
// handler (middleware.Config.Outer and Inner). Supply it with
// fx.Supply(app.Middleware{...}). docs/middleware.md says what each place
// sees and guarantees; examples/middleware has one of each.
type Middleware struct {
	// Outer runs once per delivery, after the event is decoded and the
	// delivery counted, outside the retries and the transaction;
	// framework.EnvelopeFromContext(msg.Context()) returns the event. A
	// permanent error (framework.Permanent) dead-letters the message with
	// its code; any other error nacks it, and it counts towards the
	// consumer's max_deliveries. A consumer's rate_limit waits before it.
	Outer []message.HandlerMiddleware
	// Inner runs inside each attempt, in its transaction
	// (driver.TxFromContext), for the deliveries that are not
	// duplicates (every delivery of a consumer without deduplication,
	// handlers.WithoutDedup).
	Inner []message.HandlerMiddleware
}

// routerParams are what newRouter takes from fx.
type routerParams struct {
	fx.In

	Lifecycle  fx.Lifecycle
	Config     Config
	Registry   *handlers.Registry
	Transport  driver.Transport
	SharesDB   sharesDB
	DB         *sqlx.DB
	Store      driver.Store
	Member     member `optional:"true"`
	Metrics    *middleware.Metrics
	Logger     *slog.Logger `optional:"true"`
	Tracer     trace.Tracer `optional:"true"`
	Middleware Middleware   `optional:"true"`
	Readiness  *readiness
	Outbox     *outbox.Outbox
	Prometheus registry
	// Crash is the crash tests' hook for the service's relays (see
	// relayCrash), put on the context of the runner's start.
	Crash relaysCrash `optional:"true"`
}

// relaysCrash carries the crash hook that the relays call at their crash
// points (crash.BeforeOutboxSent, crash.BeforeReplayPublish,
// crash.BeforeReplaySent). Only the module's tests supply one.
type relaysCrash struct{ hook crash.Hook }

// newRouter builds the runner of the service (see runner.New): every
// registered consumer, each with its settings from the configuration, the
// outbox relay, the replay relay, the purge and the database gauges; and
// sizes the stores' pool for what their subscriptions may hold (see
// Config.sizePool). It starts the runner when the application starts, and
// stops it when the application stops: the attempts in flight may finish
// within half of the stop timeout, the rest are canceled, roll back and
// are delivered again later.
func newRouter(p routerParams) (*runner.Runner, error) {
	consumers := make([]runner.ConsumerConfig, 0, len(p.Registry.Consumers()))
	for _, c := range p.Registry.Consumers() {
		cc := runner.ConsumerConfig{
			Consumer:    c,
			Settings:    p.Config.Settings(c.Name()),
			RenamedFrom: p.Registry.RenamedFrom(c.Name()),
		}
		cc.WithoutDedup, _ = p.Registry.WithoutDedup(c.Name())
		consumers = append(consumers, cc)
	}
	subs := &subscriptions{Transport: p.Transport, shared: p.SharesDB}
	relayMetrics, err := outbox.NewMetrics(p.Prometheus)
	if err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	r, err := runner.New(runner.Config{
		Consumers: consumers,
		Transport: subs,
		DB:        p.DB,
		Store:     p.Store,
		Logger:    orDefault(p.Logger),
		Metrics:   p.Metrics,
		Tracer:    p.Tracer,
		Outer:     p.Middleware.Outer,
		Inner:     p.Middleware.Inner,
		OutboxRelay: outbox.RelayConfig{
			TablePrefix:     p.Config.TablePrefix,
			Outbox:          p.Outbox,
			BatchTimeout:    time.Duration(p.Config.OutboxBatchTimeout),
			BatchSize:       p.Config.OutboxBatchSize,
			BatchBytes:      p.Config.OutboxBatchBytes,
			DropUnroutable:  p.Config.OutboxDropUnroutable,
			Metrics:         relayMetrics,
			MessagingSystem: messagingSystem(p.Config.Transport),
		},
		PurgeInterval:       time.Duration(p.Config.PurgeInterval),
		ProcessedRetention:  time.Duration(p.Config.ProcessedRetention),
		OutboxRetention:     time.Duration(p.Config.OutboxRetention),
		ReplayRetention:     time.Duration(p.Config.ReplayRetention),
		DeadLetterRetention: time.Duration(p.Config.DeadLetterRetention),
		TransportRetention:  time.Duration(p.Config.TransportRetention),
		PartitionLease:      time.Duration(p.Config.PartitionLease),
		Member:              string(p.Member),
		Registerer:          p.Prometheus,
		Backlogs:            backlogCounter(p.Transport),
		TopicPurger:         topicPurger(p.Transport),
		GroupAdopter:        groupAdopter(p.Transport),
	})
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	if err := p.Config.sizePool(p.DB, subs); err != nil {
		return nil, err
	}
	p.Lifecycle.Append(fx.Hook{
		// The transport's own start hook, which connects to the broker,
		// runs before this one.
		OnStart: func(ctx context.Context) error {
			ctx, cancel := untilStopRequested(ctx)
			defer cancel()
			logDeviations(ctx, orDefault(p.Logger), consumers, p.Store)
			if p.Crash.hook != nil {
				ctx = crash.With(ctx, p.Crash.hook)
			}
			if err := r.Start(ctx); err != nil {
				return fmt.Errorf("router: %w", err)
			}
			p.Readiness.set(true)
			go func() {
				<-r.Stopped()
				p.Readiness.set(false)
			}()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			p.Readiness.set(false)
			return stopRunner(ctx, r, orDefault(p.Logger))
		},
	})
	return r, nil
}

// stopRunner stops r, letting the attempts in flight finish within half
// of the time ctx leaves (the other half is for the hooks that stop after
// it). The attempts still running then are canceled: they roll back and
// their messages are delivered again later, which is no error.
func stopRunner(ctx context.Context, r *runner.Runner, logger *slog.Logger) error {
	drainCtx := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		drainCtx, cancel = context.WithTimeout(ctx, time.Until(deadline)/2)
		defer cancel()
	}
	err := r.Stop(drainCtx)
	if err != nil && drainCtx.Err() != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		logger.WarnContext(ctx, "attempts in flight canceled at stop: they roll back and are delivered again later")
		return nil
	}
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}
