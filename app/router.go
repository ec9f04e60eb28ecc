package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	"golang.org/x/time/rate"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/middleware"
)

// Middleware is the application's own middleware around every consumer's
// handler (see middleware.ChainConfig). Supply it with
// fx.Supply(app.Middleware{...}).
type Middleware struct {
	// Outer runs once per delivery, after the event is decoded and the
	// delivery counted, outside the retries and the transaction;
	// framework.DecodedFromContext(msg.Context()) returns the event. A
	// permanent error (framework.Permanent) dead-letters the message with
	// its code; any other error nacks it, and it counts towards the
	// consumer's max_deliveries. A consumer's rate_limit waits before it.
	Outer []message.HandlerMiddleware
	// Inner runs inside each attempt, in its transaction
	// (framework.TxFromContext), for the deliveries that are not
	// duplicates.
	Inner []message.HandlerMiddleware
}

// RouterParams are what NewRouter takes from fx.
type RouterParams struct {
	fx.In

	Lifecycle  fx.Lifecycle
	Config     Config
	Registry   *handlers.Registry
	Transport  framework.Transport
	DB         *sqlx.DB
	Store      Store
	Metrics    *middleware.Metrics
	Logger     *slog.Logger `optional:"true"`
	Tracer     trace.Tracer `optional:"true"`
	Middleware Middleware   `optional:"true"`
	Readiness  *Readiness
}

// NewRouter builds watermill's router with every registered consumer's
// chain, one handler per consumer and event type (times the consumer's
// concurrency where the transport needs more subscriptions). It runs the
// router when the application starts, and closes it when it stops: the
// router cancels in-flight attempts, which roll back and are delivered
// again later.
func NewRouter(p RouterParams) (*message.Router, error) {
	logger := orDefault(p.Logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NewSlogLogger(logger.With("component", "router")))
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	uow, err := framework.NewUnitOfWork(framework.UnitOfWorkConfig{DB: p.DB, Processed: p.Store, Deliveries: p.Store})
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	router.AddMiddleware(untilRunning(router))
	var subs []consumerSubscription
	for _, c := range p.Registry.Consumers() {
		cc := p.Config.Consumer(c.Name())
		// The rate limit is the first of the Outer steps: it paces the
		// deliveries that passed decoding and the delivery guard.
		outer := p.Middleware.Outer
		if cc.RateLimit > 0 {
			outer = append([]message.HandlerMiddleware{rateLimit(cc.RateLimit)}, outer...)
		}
		var (
			checkpoints framework.CheckpointStore
			order       framework.OrderStore
		)
		if cc.SkipStale {
			checkpoints = p.Store
		}
		if cc.StrictOrder {
			order = p.Store
		}
		h, err := middleware.Handler(middleware.ChainConfig{
			Checkpoints:   checkpoints,
			Order:         order,
			GapTimeout:    time.Duration(cc.GapTimeout),
			Consumer:      c,
			UnitOfWork:    uow,
			DeadLetters:   p.Store,
			Deliveries:    p.Store,
			MaxDeliveries: cc.MaxDeliveries,
			Retry:         middleware.RetryConfig{Attempts: cc.Attempts, Delay: time.Duration(cc.RetryDelay)},
			Timeout:       time.Duration(cc.Timeout),
			Logger:        logger,
			Metrics:       p.Metrics,
			Tracer:        p.Tracer,
			Outer:         outer,
			Inner:         p.Middleware.Inner,
		})
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", c.Name(), err)
		}
		timeout := time.Duration(cc.Timeout)
		sub, err := p.Transport.Subscribe(framework.SubscribeConfig{
			Consumer:       c.Name(),
			Types:          c.Types(),
			Concurrency:    cc.Concurrency,
			AttemptTimeout: timeout,
			HandlingTime:   time.Duration(cc.Attempts) * (timeout + time.Duration(cc.RetryDelay)),
		})
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", c.Name(), err)
		}
		subs = append(subs, consumerSubscription{consumer: c.Name(), sub: sub})
		seen := make(map[string]int, len(sub.Topics))
		for _, topic := range sub.Topics {
			seen[topic]++
		}
		nth := make(map[string]int, len(sub.Topics))
		for _, topic := range sub.Topics {
			name := c.Name() + "@" + topic
			if seen[topic] > 1 {
				nth[topic]++
				name = fmt.Sprintf("%s#%d", name, nth[topic])
			}
			router.AddConsumerHandler(name, topic, sub.Subscriber, h)
		}
	}
	var runErr atomic.Value
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			ctx, cancel := untilStopRequested(ctx)
			defer cancel()
			// A renamed consumer takes over its old name's history before
			// it consumes anything.
			for _, c := range p.Registry.Consumers() {
				for _, old := range p.Registry.RenamedFrom(c.Name()) {
					n, err := p.Store.Adopt(ctx, c.Name(), old)
					if err != nil {
						return fmt.Errorf("consumer %s renamed from %s: %w", c.Name(), old, err)
					}
					logger.InfoContext(ctx, "renamed consumer adopted the processed events of its old name", "consumer", c.Name(), "renamed_from", old, "adopted", n)
				}
			}
			// Bind before anything publishes, so nothing is dropped (AMQP's
			// fanout drops what reaches an exchange with no queue bound).
			// This runs after the transport's own start hook, which
			// connects to the broker.
			for _, cs := range subs {
				if err := cs.sub.Initialize(); err != nil {
					return fmt.Errorf("consumer %s: %w", cs.consumer, err)
				}
			}
			done := make(chan struct{})
			runCtx, cancelRun := context.WithCancel(context.Background())
			go func() {
				defer close(done)
				defer cancelRun()
				if err := router.Run(runCtx); err != nil {
					runErr.Store(err)
					logger.Error("router stopped", "error", err)
				}
				p.Readiness.set(false)
			}()
			select {
			case <-router.Running():
				p.Readiness.set(true)
				return nil
			case <-done:
				err, _ := runErr.Load().(error)
				return fmt.Errorf("router: %w", err)
			case <-ctx.Done():
				// Not running in time, or asked to stop. Ending Run's
				// context ends the subscriptions made so far, and the
				// messages they received, which wait in untilRunning: Run
				// returns. (Not router.Close: it would wait its CloseTimeout
				// for the handlers that never subscribed.)
				cancelRun()
				<-done
				return fmt.Errorf("router: start: %w", context.Cause(ctx))
			}
		},
		OnStop: func(ctx context.Context) error {
			p.Readiness.set(false)
			if err := router.Close(); err != nil {
				return fmt.Errorf("router: close: %w", err)
			}
			return nil
		},
	})
	return router, nil
}

// untilRunning holds every message until the router runs, that is until
// every handler has subscribed. Otherwise an attempt of the first handler
// could hold what a later handler's Subscribe needs (a connection, a
// SQLite file's write lock) and the start would wait for the attempt.
// A message whose context ends meanwhile is nacked.
func untilRunning(router *message.Router) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			select {
			case <-router.Running():
				return h(msg)
			case <-msg.Context().Done():
				return nil, fmt.Errorf("router not running yet: %w", msg.Context().Err())
			}
		}
	}
}

// consumerSubscription is a consumer's subscription, bound at start.
type consumerSubscription struct {
	consumer string
	sub      framework.Subscription
}

// rateLimit caps a consumer's messages per second. A message waiting for
// its turn when the application stops is nacked.
func rateLimit(perSecond float64) message.HandlerMiddleware {
	limiter := rate.NewLimiter(rate.Limit(perSecond), 1)
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if err := limiter.Wait(msg.Context()); err != nil {
				return nil, fmt.Errorf("rate limit: %w", err)
			}
			return next(msg)
		}
	}
}
