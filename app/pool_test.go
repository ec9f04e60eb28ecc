package app_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// TestDatabasePoolSize shows that the pool of the stores' database holds
// every attempt the consumers may have in flight, as each transport's
// subscriptions say (a connection per message in flight at batch_size 1,
// one per batch under group commit), whatever the driver's default, and
// that a database_max_conns below that is refused, naming the key and
// what makes up the need.
func TestDatabasePoolSize(t *testing.T) {
	t.Parallel()
	two := []string{"a.one", "a.two"}
	// amqpAt16 is RabbitMQ with the stores on PostgreSQL, whose driver
	// pool is smaller than the need, each attempt in a transaction of
	// its own.
	amqpAt16 := func(t *testing.T) app.Config {
		cfg := amqpConfig(t)
		cfg.DatabaseURL = testenv.PostgresURL(t)
		cfg.TransportURL = cfg.DatabaseURL
		cfg.Defaults.Concurrency = 16
		cfg.Defaults.BatchSize = 1
		return cfg
	}

	t.Run("GroupCommitOnePerBatch", func(t *testing.T) {
		t.Parallel()
		cfg := amqpAt16(t)
		cfg.Defaults.BatchSize = 0 // group commit, the default
		cfg.Defaults.Batches = 3
		cfg.Defaults.Overlap = 1 // attempts never overlap (see PostgresOverlapBesideBatches)
		cfg.DatabaseMaxConns = 1
		_, err := poolSize(t, cfg, two...)
		require.ErrorContains(t, err, "database_max_conns: 1 is fewer than the 10 connections the service may hold at once (consumer a.one 3, consumer a.two 3, outbox relay 1, replay relay 1, readiness check 1, purger 1)",
			"16 messages in flight, 3 batches at a time")
		cfg.DatabaseMaxConns = 0
		size, err := poolSize(t, cfg, two...)
		require.NoError(t, err)
		require.Equal(t, postgres.DefaultMaxOpenConns, size, "the driver's default is enough")
	})

	t.Run("AMQPTwoConsumersAt16", func(t *testing.T) {
		t.Parallel()
		size, err := poolSize(t, amqpAt16(t), two...)
		require.NoError(t, err)
		// 32 attempts, the outbox and replay relays, the readiness check,
		// the purger.
		require.Equal(t, 2*16+4, size)
		require.Greater(t, size, postgres.DefaultMaxOpenConns)
	})

	t.Run("SQLiteLeasesPerSubscription", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Consumers = map[string]middleware.Settings{"a.one": {Concurrency: 16, BatchSize: 1}}
		size, err := poolSize(t, cfg, "a.one")
		require.NoError(t, err)
		// The type's subscription and the replay topic's hold 16 leases
		// each; and their claims and acks, the cleanup, the watch, the
		// relay and its publisher, the replay relay, the readiness check,
		// the purger.
		require.Equal(t, 2*16+3+1+2+1+1+1, size)
	})

	t.Run("SQLiteTransportOfItsOwn", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.TransportURL = filepath.Join(t.TempDir(), "transport.db")
		cfg.Defaults.Concurrency = 16
		cfg.Defaults.BatchSize = 1
		size, err := poolSize(t, cfg, "a.one")
		require.NoError(t, err)
		// The leases; the claims, acks and publishes are in the other file.
		require.Equal(t, 2*16+1+1+1+1, size)
	})

	t.Run("PostgresOnePerBatch", func(t *testing.T) {
		t.Parallel()
		cfg := postgresConfig(t)
		cfg.Defaults.Concurrency = 16
		cfg.Defaults.Overlap = 1 // attempts never overlap (see PostgresOverlapBesideBatches)
		cfg.DatabaseMaxConns = 1
		_, err := poolSize(t, cfg, two...)
		require.ErrorContains(t, err, "database_max_conns: 1 is fewer than the 9 connections the service may hold at once (consumer a.one 2, consumer a.two 2, outbox relay 2, replay relay 1, readiness check 1, purger 1)",
			"16 messages in flight per topic, two batches per consumer")
		cfg.DatabaseMaxConns = 0
		size, err := poolSize(t, cfg, two...)
		require.NoError(t, err)
		require.Equal(t, postgres.DefaultMaxOpenConns, size, "the driver's default is enough")
	})

	// On PostgreSQL, the attempts that overlap while the handlers wait
	// outside the database (overlap, 32 by default) hold a connection
	// each, beside the batches: the concurrency bounds the two together.
	t.Run("PostgresOverlapBesideBatches", func(t *testing.T) {
		t.Parallel()
		cfg := postgresConfig(t)
		cfg.Defaults.Concurrency = 64
		cfg.DatabaseMaxConns = 1
		_, err := poolSize(t, cfg, two...)
		require.ErrorContains(t, err, "database_max_conns: 1 is fewer than the 73 connections the service may hold at once (consumer a.one 34, consumer a.two 34, outbox relay 2, replay relay 1, readiness check 1, purger 1)",
			"64 messages in flight per topic, two batches and 32 overlapping attempts per consumer")
		cfg.Defaults.Concurrency = 16
		_, err = poolSize(t, cfg, two...)
		require.ErrorContains(t, err, "(consumer a.one 32, consumer a.two 32,", "no more than the messages in flight, 16 per topic")
	})

	t.Run("MemoryOnePerTopic", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Transport = app.TransportMemory
		cfg.DatabaseMaxConns = 1
		_, err := poolSize(t, cfg, two...)
		require.ErrorContains(t, err, "database_max_conns: 1 is fewer than the 8 connections the service may hold at once (consumer a.one 2, consumer a.two 2, outbox relay 1, replay relay 1, readiness check 1, purger 1)")
	})

	t.Run("SmallNeedKeepsTheDriversPool", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Transport = app.TransportMemory
		size, err := poolSize(t, cfg, "a.one")
		require.NoError(t, err)
		require.Equal(t, sqlite.DefaultMaxOpenConns, size)
	})

	t.Run("DefaultsWithoutHTTP", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.HTTPAddr = ""
		cfg.DatabaseMaxConns = 1
		_, err := poolSize(t, cfg, "a.one")
		// The consumer's batches; the claims and acks of its two
		// subscriptions (its type's and its replay topic's), the cleanup,
		// the watch; the relay and its publisher; the replay relay; the
		// purger.
		require.ErrorContains(t, err, fmt.Sprintf("fewer than the 10 connections the service may hold at once (consumer a.one %d, consumer a.one's subscriber 4, outbox relay 2, replay relay 1, purger 1)", driver.DefaultBatches))
		cfg.DatabaseMaxConns = 0
		size, err := poolSize(t, cfg, "a.one")
		require.NoError(t, err)
		require.Equal(t, driver.DefaultBatches+4+2+1+1, size, "two above the driver's default")
		require.Equal(t, sqlite.DefaultMaxOpenConns+2, size)
	})

	t.Run("AMQPThreeConsumersAtTheDefault", func(t *testing.T) {
		t.Parallel()
		cfg := amqpAt16(t)
		cfg.Defaults.Concurrency = 0
		size, err := poolSize(t, cfg, "a.one", "a.two", "a.three")
		require.NoError(t, err)
		// 16 attempts per consumer, the outbox and replay relays, the
		// readiness check, the purger.
		require.Equal(t, 3*app.DefaultUngroupedConcurrency+4, size)
	})

	t.Run("ExplicitRespected", func(t *testing.T) {
		t.Parallel()
		cfg := amqpAt16(t)
		cfg.DatabaseMaxConns = 50
		size, err := poolSize(t, cfg, two...)
		require.NoError(t, err)
		require.Equal(t, 50, size)
	})

	t.Run("ExplicitTooSmallRefused", func(t *testing.T) {
		t.Parallel()
		cfg := amqpAt16(t)
		cfg.DatabaseMaxConns = 10
		_, err := poolSize(t, cfg, two...)
		require.ErrorContains(t, err, "database_max_conns: 10 is fewer than the 36 connections")
		require.ErrorContains(t, err, "consumer a.one 16, consumer a.two 16")
	})

	t.Run("ExplicitTooSmallStopsStart", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Defaults.Concurrency = 16
		cfg.DatabaseMaxConns = 3
		service := app.New(
			handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
			handlers.Register("widgets.pool-check", handlers.On(widgetAdded, newAddWidget)),
			fx.Supply(widgetMigrations),
			fx.Replace(cfg),
		)
		require.ErrorContains(t, service.Err(), "database_max_conns: 3 is fewer than")
	})

	t.Run("NegativeRefused", func(t *testing.T) {
		t.Parallel()
		_, err := app.LoadConfig(env(t, "database_max_conns: -1\n", nil))
		require.ErrorContains(t, err, "database_max_conns: want 1 or more")
	})
}

// poolSize builds the application of cfg, without starting it, with a
// consumer of widgetAdded by each name, and returns the size of the
// stores' pool, or the error of the build. It closes what the build
// opened when the test ends.
func poolSize(t *testing.T, cfg app.Config, names ...string) (int, error) {
	t.Helper()
	opts := []fx.Option{fx.Supply(widgetMigrations), fx.Replace(cfg)}
	for _, name := range names {
		opts = append(opts, handlers.Register(name, handlers.On(widgetAdded, newAddWidget)))
	}
	var db *sqlx.DB
	service := app.New(append(opts, fx.Populate(&db))...)
	if err := service.Err(); err != nil {
		return 0, err
	}
	// Started and stopped, so that its stop hooks close what it opened
	// (a transport's database of its own too).
	require.NoError(t, service.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, service.Stop(context.Background())) })
	return db.Stats().MaxOpenConnections, nil
}

type poolProbeV1 struct {
	N int `json:"n"`
}

// poolProbe is an event type of this test alone: its exchange on the
// shared broker has no other queue bound.
var poolProbe = framework.Define[poolProbeV1]("widgets.pool.probed", 1)

// barrier holds every arrival until want have arrived, or ctx ends.
type barrier struct {
	mu      sync.Mutex
	arrived int
	want    int
	all     chan struct{}
}

func newBarrier(want int) *barrier { return &barrier{want: want, all: make(chan struct{})} }

func (b *barrier) wait(ctx context.Context) error {
	b.mu.Lock()
	b.arrived++
	if b.arrived == b.want {
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestPoolHoldsEveryAttempt runs two consumers at concurrency 16, each
// attempt in a transaction of its own (batch_size 1), on RabbitMQ and
// PostgreSQL whose handlers each wait, inside their attempt's
// transaction, until all 32 attempts are inside theirs. With the pool at
// PostgreSQL's default of 10 connections, the 11th attempt never gets
// one, and nothing takes effect; sized from the consumers, all 32 do.
func TestPoolHoldsEveryAttempt(t *testing.T) {
	t.Parallel()
	const perConsumer = 16
	cfg := testConfig(t)
	cfg.Transport = app.TransportAMQP
	cfg.AMQPURL = testenv.Require(t, testenv.AMQPURLVar)
	cfg.DatabaseURL = testenv.PostgresURL(t)
	cfg.TransportURL = cfg.DatabaseURL
	cfg.AMQPPrefetch = 1 // each subscription takes one message: 16 go to 16
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	names := []string{"widgets.pool-one-" + suffix, "widgets.pool-two-" + suffix}
	cfg.Consumers = map[string]middleware.Settings{}
	for _, name := range names {
		cfg.Consumers[name] = middleware.Settings{Concurrency: perConsumer, BatchSize: 1}
	}
	t.Cleanup(func() { deleteQueues(t, cfg.AMQPURL, names...) })

	all := newBarrier(2 * perConsumer)
	newHandler := func(db *sqlx.DB) framework.HandlerFunc[poolProbeV1] {
		return func(ctx context.Context, ev framework.Event[poolProbeV1]) error {
			if err := all.wait(ctx); err != nil {
				return err
			}
			_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO widgets (name, event_id) VALUES (?, ?)`), "probe", ev.ID)
			return err
		}
	}
	b := setup(t, cfg,
		handlers.Register(names[0], handlers.On(poolProbe, newHandler)),
		handlers.Register(names[1], handlers.On(poolProbe, newHandler)),
	)
	for i := range perConsumer {
		env, err := poolProbe.Envelope(poolProbeV1{N: i}, framework.Attributes{ID: "p-" + strconv.Itoa(i), Source: "widgets"})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NoError(t, b.transport.Publisher().Publish(poolProbe.Type(), msg))
	}
	waitFor(t, "32 effects", func() bool {
		return b.count(t, `SELECT count(*) FROM widgets WHERE name = 'probe'`) == 2*perConsumer
	})
}

// deleteQueues deletes the consumers' queues from the shared broker.
func deleteQueues(t *testing.T, url string, names ...string) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Logf("delete queues: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("delete queues: %v", err)
		return
	}
	defer ch.Close()
	for _, name := range names {
		if _, err := ch.QueueDelete(name, false, false, false); err != nil {
			t.Logf("delete queue %s: %v", name, err)
		}
	}
}
