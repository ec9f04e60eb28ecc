package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
)

// TransportParams are what NewTransport takes from fx.
type TransportParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	DB        *sqlx.DB
	Logger    *slog.Logger `optional:"true"`
}

// NewTransport builds the configured transport (framework.Transport); on
// amqp it connects in the start hook. It closes the transport when the
// application stops.
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
//   - memory: GoChannel hands every message to every subscription, each
//     in a goroutine of its own.
func NewTransport(p TransportParams) (framework.Transport, error) {
	tr, closeDB, err := openTransport(context.Background(), p.Config, p.DB, orDefault(p.Logger), true)
	if err != nil {
		return nil, err
	}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			a, ok := tr.(*amqp.Transport)
			if !ok {
				return nil
			}
			// The broker may be down at boot: connect here, retrying with
			// backoff until the start timeout; the router, whose hook
			// comes later, binds every consumer's queue before anything
			// publishes.
			ctx, cancel := untilStopRequested(ctx)
			defer cancel()
			ctx, cancelEarly := beforeDeadline(ctx)
			defer cancelEarly()
			return connectAMQP(ctx, a)
		},
		OnStop: func(context.Context) error {
			return errors.Join(tr.Close(), closeDB())
		},
	})
	return tr, nil
}

// openTransport builds the transport of cfg; db is the database of the
// stores, which the SQL transports share when the transport's URL is the
// database's. closeDB closes the database it opened otherwise. With
// subscribe, the postgres transport opens its subscribers' pool.
func openTransport(ctx context.Context, cfg Config, db *sqlx.DB, logger *slog.Logger, subscribe bool) (_ framework.Transport, closeDB func() error, err error) {
	closeDB = func() error { return nil }
	switch cfg.Transport {
	case TransportMemory:
		tr, err := memory.New(memory.PubSubConfig{Logger: watermill.NewSlogLogger(logger)})
		if err != nil {
			return nil, nil, fmt.Errorf("transport: %w", err)
		}
		return tr, closeDB, nil
	case TransportAMQP:
		tr, err := amqp.New(amqp.Config{URL: cfg.AMQPURL, Prefetch: cfg.AMQPPrefetch, Logger: logger})
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", EnvAMQPURL, err)
		}
		return tr, closeDB, nil
	case TransportSQLite, TransportPostgres:
	default:
		return nil, nil, fmt.Errorf("%s: %q is not available", EnvTransport, cfg.Transport)
	}
	tdb := db
	if cfg.TransportURL != cfg.DatabaseURL {
		if tdb, err = openTransportDB(ctx, cfg); err != nil {
			return nil, nil, fmt.Errorf("transport database: %w", err)
		}
		closeDB = tdb.Close
	}
	var tr framework.Transport
	if cfg.Transport == TransportSQLite {
		tr, err = sqlite.New(tdb, sqlite.TransportConfig{TablePrefix: cfg.TablePrefix, Logger: logger})
	} else {
		pc := postgres.TransportConfig{TablePrefix: cfg.TablePrefix, Logger: logger}
		if subscribe {
			pc.URL = cfg.TransportURL
		}
		tr, err = postgres.New(ctx, tdb, pc)
	}
	if err != nil {
		_ = closeDB()
		return nil, nil, fmt.Errorf("transport: %w", err)
	}
	return tr, closeDB, nil
}

// connectAMQP connects tr, naming the setting to check when the broker
// is unreachable or refuses the credentials (the password is not shown).
func connectAMQP(ctx context.Context, tr *amqp.Transport) error {
	if err := tr.Connect(ctx); err != nil {
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

// replayer is the transport's replay path alone, for the operator's
// replay command: no subscriber, and nothing of the consumers' handlers.
type replayer struct {
	framework.Transport
	closeDB func() error
}

// Close closes the transport, then the database openReplayer opened.
func (r *replayer) Close() error {
	return errors.Join(r.Transport.Close(), r.closeDB())
}

// openReplayer opens the replay path of the configured transport; db is
// the database of the stores. On amqp it waits for the broker at most
// replayConnectTimeout, and not at all when the broker refuses the
// credentials.
func openReplayer(ctx context.Context, cfg Config, db *sqlx.DB) (*replayer, error) {
	if cfg.Transport == TransportMemory {
		return nil, fmt.Errorf("%s: memory keeps its messages in the serving process: a replay from another process would reach no one", EnvTransport)
	}
	tr, closeDB, err := openTransport(ctx, cfg, db, slog.New(slog.DiscardHandler), false)
	if err != nil {
		return nil, err
	}
	r := &replayer{Transport: tr, closeDB: closeDB}
	if a, ok := tr.(*amqp.Transport); ok {
		connectCtx, cancel := context.WithTimeout(ctx, replayConnectTimeout)
		defer cancel()
		if err := connectAMQP(connectCtx, a); err != nil {
			_ = r.Close() // the error that stopped the opening is what matters
			return nil, err
		}
	}
	return r, nil
}

// openTransportDB opens the SQL transport's database of its own.
func openTransportDB(ctx context.Context, cfg Config) (*sqlx.DB, error) {
	if cfg.Transport == TransportPostgres {
		return postgres.Open(ctx, cfg.TransportURL, postgres.OpenConfig{})
	}
	return sqlite.Open(ctx, cfg.TransportURL, sqlite.OpenConfig{})
}
