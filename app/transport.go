package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/handlers"
)

// Transport is the broker side of the application: one publisher, and a
// subscriber per consumer.
//
// How a consumer's concurrency (ConsumerConfig.Concurrency) is spent
// depends on the transport:
//   - amqp: that many subscriptions of the consumer's one queue, each
//     handling one message at a time (competing consumers; the prefetch
//     only buffers);
//   - sqlite: one subscription per event type, holding that many leases in
//     flight;
//   - postgres: none extra. watermill-sql hands out one message at a time
//     per consumer group while it holds a pooled connection in an open
//     transaction, so more subscriptions would only wait for the group's
//     lock with a connection each. Run more processes for failover, not
//     throughput;
//   - memory: GoChannel (memory.PubSub) hands every message to every
//     subscription, each in a goroutine of its own.
type Transport struct {
	// Publisher publishes events to their type's topic.
	Publisher message.Publisher

	subscriber func(consumer string, cc ConsumerConfig) (message.Subscriber, error)
	// topics returns the topic of each router handler of a consumer that
	// handles types.
	topics func(consumer string, types []string, cc ConsumerConfig) []string
	// replay publishes messages to one consumer alone.
	replay func(ctx context.Context, consumer string, msgs ...*message.Message) error
	// ready reports whether the broker is reachable; nil means always.
	ready func() bool
}

// Subscriber returns the subscriber of consumer, whose consumer group (or
// queue) is named after it.
func (t *Transport) Subscriber(consumer string, cc ConsumerConfig) (message.Subscriber, error) {
	return t.subscriber(consumer, cc)
}

// Replay publishes msgs (dead letters being replayed) to consumer alone:
// on amqp straight to its queue through the default exchange, on the SQL
// transports to its replay topic (framework.ReplayTopic). Other consumers
// of the same event type do not see them again.
func (t *Transport) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	return t.replay(ctx, consumer, msgs...)
}

// Ready reports whether the transport can deliver now: false while the
// AMQP connection is down (before it first succeeded, and while it
// reconnects).
func (t *Transport) Ready() bool { return t.ready == nil || t.ready() }

// TransportParams are what NewTransport takes from fx.
type TransportParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	DB        *sqlx.DB
	Registry  *handlers.Registry
	Logger    *slog.Logger `optional:"true"`
}

// NewTransport builds the configured transport and closes it when the
// application stops.
func NewTransport(p TransportParams) (*Transport, error) {
	logger := orDefault(p.Logger)
	switch p.Config.Transport {
	case TransportMemory:
		ch, err := memory.NewPubSub(memory.PubSubConfig{Logger: watermill.NewSlogLogger(logger)})
		if err != nil {
			return nil, fmt.Errorf("transport: %w", err)
		}
		p.Lifecycle.Append(fx.StopHook(ch.Close))
		return &Transport{
			Publisher:  ch,
			subscriber: func(string, ConsumerConfig) (message.Subscriber, error) { return ch, nil },
			// Every subscription gets every message; only the consumer
			// subscribes to its replay topic.
			topics: perTypeAndReplay,
			replay: func(ctx context.Context, consumer string, msgs ...*message.Message) error {
				return publishWithContext(ctx, ch, framework.ReplayTopic(consumer), msgs)
			},
		}, nil
	case TransportSQLite:
		return newSQLiteTransport(p, logger)
	case TransportPostgres:
		return newPostgresTransport(p, logger)
	case TransportAMQP:
		return newAMQPTransport(p, logger)
	}
	return nil, fmt.Errorf("EFFECTIVELY_TRANSPORT: %q is not available", p.Config.Transport)
}

// perTypeAndReplay gives a consumer one router handler per event type and
// one for its replay topic.
func perTypeAndReplay(consumer string, types []string, _ ConsumerConfig) []string {
	return append(append([]string(nil), types...), framework.ReplayTopic(consumer))
}

func newSQLiteTransport(p TransportParams, logger *slog.Logger) (*Transport, error) {
	db := p.DB
	if p.Config.TransportURL != p.Config.DatabaseURL {
		var err error
		db, err = sqlite.Open(context.Background(), p.Config.TransportURL, sqlite.OpenConfig{})
		if err != nil {
			return nil, fmt.Errorf("transport database: %w", err)
		}
		p.Lifecycle.Append(fx.StopHook(db.Close))
	}
	notifier := sqlite.NewNotifier()
	pub, err := sqlite.NewPublisher(db, sqlite.PublisherConfig{TablePrefix: p.Config.TablePrefix, Notifier: notifier, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	p.Lifecycle.Append(fx.StopHook(pub.Close))
	return &Transport{
		Publisher: pub,
		subscriber: func(consumer string, cc ConsumerConfig) (message.Subscriber, error) {
			sub, err := sqlite.NewSubscriber(db, sqlite.SubscriberConfig{
				ConsumerGroup: consumer,
				TablePrefix:   p.Config.TablePrefix,
				Notifier:      notifier,
				LeaseDuration: leaseFor(cc),
				MaxInFlight:   cc.Concurrency,
				Logger:        logger,
			})
			if err != nil {
				return nil, fmt.Errorf("transport: consumer %s: %w", consumer, err)
			}
			p.Lifecycle.Append(fx.StopHook(sub.Close))
			return sub, nil
		},
		// One subscription per type; the subscriber holds Concurrency
		// leases in flight.
		topics: perTypeAndReplay,
		replay: func(ctx context.Context, consumer string, msgs ...*message.Message) error {
			return publishWithContext(ctx, pub, framework.ReplayTopic(consumer), msgs)
		},
	}, nil
}

func newPostgresTransport(p TransportParams, logger *slog.Logger) (*Transport, error) {
	ctx := context.Background()
	// watermill-sql holds a pooled connection in an open transaction per
	// subscription: the subscribers get a pool of their own, one
	// connection per subscription and two to spare, so that the handlers'
	// transactions and the dead-letter writes on the stores' pool never
	// wait for them.
	subscriptions := 0
	for _, c := range p.Registry.Consumers() {
		subscriptions += len(perTypeAndReplay(c.Name(), c.Types(), ConsumerConfig{}))
	}
	subDB, err := postgres.Open(ctx, p.Config.TransportURL, postgres.OpenConfig{MaxOpenConns: subscriptions + 2})
	if err != nil {
		return nil, fmt.Errorf("transport database: %w", err)
	}
	p.Lifecycle.Append(fx.StopHook(subDB.Close))
	pubDB := p.DB
	if p.Config.TransportURL != p.Config.DatabaseURL {
		if pubDB, err = postgres.Open(ctx, p.Config.TransportURL, postgres.OpenConfig{}); err != nil {
			return nil, fmt.Errorf("transport database: %w", err)
		}
		p.Lifecycle.Append(fx.StopHook(pubDB.Close))
	}
	base := postgres.TransportConfig{TablePrefix: p.Config.TablePrefix, Logger: logger}
	pub, err := postgres.NewPublisher(pubDB, base)
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	p.Lifecycle.Append(fx.StopHook(pub.Close))
	return &Transport{
		Publisher: pub,
		subscriber: func(consumer string, cc ConsumerConfig) (message.Subscriber, error) {
			cfg := base
			cfg.AckDeadline = ackDeadlineFor(cc)
			sub, err := postgres.NewSubscriber(subDB, consumer, cfg)
			if err != nil {
				return nil, fmt.Errorf("transport: consumer %s: %w", consumer, err)
			}
			p.Lifecycle.Append(fx.StopHook(sub.Close))
			return sub, nil
		},
		// One subscription per type and the replay topic, whatever the
		// concurrency (see Transport).
		topics: perTypeAndReplay,
		replay: pub.Replay,
	}, nil
}

func newAMQPTransport(p TransportParams, logger *slog.Logger) (*Transport, error) {
	conn, err := amqp.NewConnection(amqp.Config{URL: p.Config.AMQPURL, Prefetch: p.Config.AMQPPrefetch, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("EFFECTIVELY_AMQP_URL: %w", err)
	}
	pub, err := amqp.NewPublisher(conn)
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	// The broker may be down at boot: connect in the start hook, retrying
	// with backoff until the start timeout; the router, whose hook comes
	// later, binds every consumer's queue before anything publishes.
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			ctx, cancel := untilStopRequested(ctx)
			defer cancel()
			ctx, cancelEarly := beforeDeadline(ctx)
			defer cancelEarly()
			return connectAMQP(ctx, conn)
		},
		OnStop: func(context.Context) error {
			_ = pub.Close()
			return conn.Close()
		},
	})
	return &Transport{
		Publisher: pub,
		subscriber: func(consumer string, _ ConsumerConfig) (message.Subscriber, error) {
			sub, err := amqp.NewSubscriber(conn, consumer)
			if err != nil {
				return nil, fmt.Errorf("transport: consumer %s: %w", consumer, err)
			}
			p.Lifecycle.Append(fx.StopHook(sub.Close))
			return sub, nil
		},
		// Every subscription reads the consumer's one queue, bound to each
		// of its types: Concurrency subscriptions in all.
		topics: func(_ string, types []string, cc ConsumerConfig) []string {
			topics := make([]string, max(cc.Concurrency, 1))
			for i := range topics {
				topics[i] = types[0]
			}
			return topics
		},
		replay: pub.Replay,
		ready:  conn.Connected,
	}, nil
}

// connectAMQP connects conn, naming the setting to check when the broker
// is unreachable or refuses the credentials (the password is not shown).
func connectAMQP(ctx context.Context, conn *amqp.Connection) error {
	if err := conn.Connect(ctx); err != nil {
		return fmt.Errorf("%s: %w", EnvAMQPURL, err)
	}
	return nil
}

// beforeDeadline returns a context that ends a tenth of the time left
// before ctx's deadline, if it has one. A start hook that waits with it
// fails with its own error: fx's Start returns a bare "context deadline
// exceeded" when its context ends first.
func beforeDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, deadline.Add(-time.Until(deadline)/10))
}

// replayConnectTimeout bounds how long a replay waits for the broker.
const replayConnectTimeout = 5 * time.Second

// replayer is the transport's replay path alone (see Transport.Replay),
// for the operator's replay command: no subscriber, and nothing of the
// consumers' handlers.
type replayer struct {
	replay  func(ctx context.Context, consumer string, msgs ...*message.Message) error
	closers []func() error
}

// Replay publishes msgs to consumer alone, as Transport.Replay does.
func (r *replayer) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	return r.replay(ctx, consumer, msgs...)
}

// Close closes what openReplayer opened, the last opened first.
func (r *replayer) Close() error {
	var errs []error
	for i := len(r.closers) - 1; i >= 0; i-- {
		errs = append(errs, r.closers[i]())
	}
	r.closers = nil
	return errors.Join(errs...)
}

// openReplayer opens the replay path of the configured transport; db is
// the database of the stores. On amqp it waits for the broker at most
// replayConnectTimeout, and not at all when the broker refuses the
// credentials.
func openReplayer(ctx context.Context, cfg Config, db *sqlx.DB) (_ *replayer, err error) {
	r := &replayer{}
	defer func() {
		if err != nil {
			_ = r.Close() // the error that stopped the opening is what matters
		}
	}()
	switch cfg.Transport {
	case TransportMemory:
		return nil, fmt.Errorf("%s: memory keeps its messages in the serving process: a replay from another process would reach no one", EnvTransport)
	case TransportSQLite:
		tdb := db
		if cfg.TransportURL != cfg.DatabaseURL {
			if tdb, err = sqlite.Open(ctx, cfg.TransportURL, sqlite.OpenConfig{}); err != nil {
				return nil, fmt.Errorf("transport database: %w", err)
			}
			r.closers = append(r.closers, tdb.Close)
		}
		pub, err := sqlite.NewPublisher(tdb, sqlite.PublisherConfig{TablePrefix: cfg.TablePrefix})
		if err != nil {
			return nil, fmt.Errorf("transport: %w", err)
		}
		r.closers = append(r.closers, pub.Close)
		r.replay = func(ctx context.Context, consumer string, msgs ...*message.Message) error {
			return publishWithContext(ctx, pub, framework.ReplayTopic(consumer), msgs)
		}
	case TransportPostgres:
		tdb := db
		if cfg.TransportURL != cfg.DatabaseURL {
			if tdb, err = postgres.Open(ctx, cfg.TransportURL, postgres.OpenConfig{}); err != nil {
				return nil, fmt.Errorf("transport database: %w", err)
			}
			r.closers = append(r.closers, tdb.Close)
		}
		pub, err := postgres.NewPublisher(tdb, postgres.TransportConfig{TablePrefix: cfg.TablePrefix})
		if err != nil {
			return nil, fmt.Errorf("transport: %w", err)
		}
		r.closers = append(r.closers, pub.Close)
		r.replay = pub.Replay
	case TransportAMQP:
		conn, err := amqp.NewConnection(amqp.Config{URL: cfg.AMQPURL, Prefetch: cfg.AMQPPrefetch})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvAMQPURL, err)
		}
		r.closers = append(r.closers, conn.Close)
		connectCtx, cancel := context.WithTimeout(ctx, replayConnectTimeout)
		defer cancel()
		if err := connectAMQP(connectCtx, conn); err != nil {
			return nil, err
		}
		pub, err := amqp.NewPublisher(conn)
		if err != nil {
			return nil, fmt.Errorf("transport: %w", err)
		}
		r.closers = append(r.closers, pub.Close)
		r.replay = pub.Replay
	default:
		return nil, fmt.Errorf("%s: %q is not available", EnvTransport, cfg.Transport)
	}
	return r, nil
}

// publishWithContext publishes msgs to topic with ctx as their context.
func publishWithContext(ctx context.Context, pub message.Publisher, topic string, msgs []*message.Message) error {
	for _, msg := range msgs {
		m := msg.Copy()
		m.SetContext(ctx)
		if err := pub.Publish(topic, m); err != nil {
			return err
		}
	}
	return nil
}

// leaseFor returns the SQLite lease of a consumer's messages. The
// subscriber renews it every third of its length while a message is held,
// so it need not outlast the handling, only a renewal period plus a
// renewal's wait for the file's write lock, which an attempt holds at most
// its timeout: twice the attempt timeout (60s with the defaults), at least
// a second. It bounds how long the messages of a process that died wait,
// whatever the concurrency.
func leaseFor(cc ConsumerConfig) time.Duration {
	return max(time.Second, 2*time.Duration(cc.Timeout))
}

// ackDeadlineFor returns the PostgreSQL transport's ack deadline, which
// is not renewed: it outlasts the whole handling of a healthy message,
// attempts × (timeout + delay), plus a quarter and a second. The
// transport hands out one message at a time per consumer group, so the
// concurrency does not count.
func ackDeadlineFor(cc ConsumerConfig) time.Duration {
	budget := time.Duration(cc.Attempts) * (time.Duration(cc.Timeout) + time.Duration(cc.RetryDelay))
	return budget + budget/4 + time.Second
}
