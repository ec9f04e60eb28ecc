package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/watermilllog"
)

// transportParams are what newTransport takes from fx.
type transportParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	DB        *sqlx.DB
	Member    member       `optional:"true"`
	Logger    *slog.Logger `optional:"true"`
}

// sharesDB says whether the transport was given the stores' database
// (a SQL transport whose URL is DatabaseURL): its publisher and its
// subscribers' own work then take connections of that pool (see
// sizePool).
type sharesDB bool

// connector is a transport that connects to a broker before it delivers
// (amqp.Transport).
type connector interface {
	Connect(ctx context.Context) error
}

// newTransport builds the configured transport (driver.Transport); a
// transport that connects to a broker connects in the start hook. It
// closes the transport when the application stops.
//
// How a consumer's concurrency (middleware.Settings.Concurrency) is spent
// depends on the transport:
//   - amqp: that many subscriptions of the consumer's one queue, each
//     handling one message at a time (competing consumers; the prefetch
//     only buffers);
//   - sqlite: one subscription per event type, holding that many leases in
//     flight;
//   - postgres: one subscription per event type, handing out that many
//     messages at once (one process per consumer group and topic hands
//     out, the others stand by). Run more processes for failover, not
//     throughput;
//   - memory: GoChannel hands every message to every subscription, each
//     in a goroutine of its own.
func newTransport(p transportParams) (driver.Transport, sharesDB, error) {
	tr, closeDB, shared, err := openTransport(context.Background(), p.Config, p.DB, p.Member, orDefault(p.Logger))
	if err != nil {
		return nil, false, err
	}
	// A stop hook of its own, so that a build that fails later closes
	// the transport too (see New).
	p.Lifecycle.Append(fx.StopHook(func() error { return errors.Join(tr.Close(), closeDB()) }))
	if c, ok := tr.(connector); ok {
		p.Lifecycle.Append(fx.StartHook(func(ctx context.Context) error {
			// The broker may be down at boot: connect here, retrying with
			// backoff until the start timeout; the router, whose hook
			// comes later, binds every consumer's queue before anything
			// publishes.
			ctx, cancel := untilStopRequested(ctx)
			defer cancel()
			ctx, cancelEarly := beforeDeadline(ctx)
			defer cancelEarly()
			return connect(ctx, c)
		}))
	}
	return tr, sharesDB(shared), nil
}

// openTransport builds the transport of cfg. A SQL transport keeps its
// messages in db, the stores' database (shared), unless TransportURL is
// another: then closeDB closes the database it opened there. The postgres
// transport also opens its subscribers' pool, at TransportURL. The
// connections it opens to PostgreSQL are named after m, when set (see
// member). The amqp transport's heartbeat follows the partitions' lease
// (amqpHeartbeat).
func openTransport(ctx context.Context, cfg Config, db *sqlx.DB, m member, logger *slog.Logger) (tr driver.Transport, closeDB func() error, shared bool, err error) {
	closeDB = func() error { return nil }
	shared = cfg.TransportURL == cfg.DatabaseURL
	sqlDB := func() (*sqlx.DB, error) {
		if shared {
			return db, nil
		}
		d, err := openDB(ctx, cfg.TransportURL, 0, false, m)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		closeDB = d.Close
		return d, nil
	}
	switch cfg.Transport {
	case TransportMemory:
		tr, err = memory.New(memory.TransportConfig{Logger: watermilllog.New(logger)})
		shared = false
	case TransportAMQP:
		ac := amqp.TransportConfig{
			URL: cfg.AMQPURL, Prefetch: cfg.AMQPPrefetch, QueueType: cfg.AMQPQueueType, DeliveryLimit: cfg.AMQPDeliveryLimit,
			Heartbeat: amqpHeartbeat(time.Duration(cfg.PartitionLease)), Logger: logger,
		}
		if tr, err = amqp.New(ac); err != nil {
			return nil, nil, false, fmt.Errorf("%s: %w", setting("amqp_url", EnvAMQPURL), err)
		}
		shared = false
	case TransportSQLite:
		if db, err = sqlDB(); err == nil {
			tr, err = sqlite.New(db, sqlite.TransportConfig{TablePrefix: cfg.TablePrefix, Logger: logger})
		}
	case TransportPostgres:
		pc := postgres.TransportConfig{URL: cfg.TransportURL, TablePrefix: cfg.TablePrefix, ApplicationName: string(m), Logger: logger}
		if db, err = sqlDB(); err == nil {
			tr, err = postgres.New(ctx, db, pc)
		}
	default:
		return nil, nil, false, fmt.Errorf("%s: %q is not available", setting("transport", EnvTransport), cfg.Transport)
	}
	if err != nil {
		return nil, nil, false, errors.Join(fmt.Errorf("transport: %w", err), closeDB())
	}
	return tr, closeDB, shared, nil
}

// amqpHeartbeat is the AMQP heartbeat of a service whose partitions'
// leases last lease: a third of it, at least a second (amqp091-go counts
// whole seconds). The broker closes the connection of a process that sent
// nothing for about two heartbeats, which ends its consumers: a process
// frozen past its lease no longer holds its partitions' queues (single
// active consumer) when their new owners subscribe.
func amqpHeartbeat(lease time.Duration) time.Duration {
	lease = cmp.Or(lease, driver.DefaultLease)
	return max(lease/3, time.Second)
}

// connect connects tr, naming the setting to check when the broker is
// unreachable or refuses the credentials (the password is not shown).
func connect(ctx context.Context, tr connector) error {
	if err := tr.Connect(ctx); err != nil {
		return fmt.Errorf("%s: %w", setting("amqp_url", EnvAMQPURL), err)
	}
	return nil
}

// minDeadlineMargin is the least time beforeDeadline leaves between its
// context's end and ctx's, when half the time left allows it: the hook
// must return its error, and fx see it, within that margin on a loaded
// machine.
const minDeadlineMargin = 500 * time.Millisecond

// beforeDeadline returns a context that ends before ctx's deadline, if it
// has one: a tenth of the time left earlier, at least minDeadlineMargin
// (at most half the time left). A start hook that waits with it fails
// with its own error: fx's Start returns a bare "context deadline
// exceeded" when its context ends first.
func beforeDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	left := time.Until(deadline)
	margin := min(max(left/10, minDeadlineMargin), left/2)
	return context.WithDeadline(ctx, deadline.Add(-margin))
}
