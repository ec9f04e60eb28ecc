package runner

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/middleware"
)

type itemAdded struct {
	ID string `json:"id" validate:"required"`
}

var added = framework.Define[itemAdded]("tests.item.added", 1)

// env is a migrated SQLite database with an items table, its store, and a
// consumer whose handler inserts the item and then runs hold, in the
// attempt's transaction.
type env struct {
	db       *sqlx.DB
	store    *sqlite.Store
	consumer *framework.Consumer
	hold     atomic.Pointer[func(ctx context.Context) error]
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "app.db"), sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	_, err = db.ExecContext(ctx, `CREATE TABLE items (id TEXT)`)
	require.NoError(t, err)
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	e := &env{db: db, store: store}
	e.consumer, err = framework.NewConsumer("tests.items",
		framework.Handle(added, func(ctx context.Context, ev framework.Event[itemAdded]) error {
			if _, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO items (id) VALUES (?)`, ev.Data.ID); err != nil {
				return err
			}
			if hold := e.hold.Load(); hold != nil {
				return (*hold)(ctx)
			}
			return nil
		}),
	)
	require.NoError(t, err)
	return e
}

// runner returns a started runner of the consumer on a new transport of
// the database, stopped at the end of the test: its attempts' time limit
// is a second, or timeout when given.
func (e *env) runner(t *testing.T, timeout ...time.Duration) (*Runner, driver.Transport) {
	t.Helper()
	limit := time.Second
	if len(timeout) > 0 {
		limit = timeout[0]
	}
	transport, err := sqlite.New(e.db, sqlite.TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = transport.Close() })
	r, err := New(Config{
		// A short timeout: a lease of the canceled attempt's message ends
		// soon (twice the timeout).
		Consumers: []ConsumerConfig{{Consumer: e.consumer, Settings: middleware.Settings{Timeout: limit, Attempts: 1}}},
		Transport: transport,
		DB:        e.db,
		Store:     e.store,
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	return r, transport
}

func (e *env) publish(t *testing.T, transport driver.Transport, id string) {
	t.Helper()
	env, err := added.Envelope(itemAdded{ID: id}, framework.Attributes{ID: id, Source: "tests"})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	require.NoError(t, transport.Publisher().Publish(added.Type(), msg))
}

func (e *env) items(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.Get(&n, `SELECT count(*) FROM items`))
	return n
}

// stoppingNow reports whether Stop closed the intake.
func (r *Runner) stoppingNow() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopping
}

// TestStartStop: Start returns with the consumer subscribed, a published
// event takes effect, Stop closes the router; a second Start is refused.
func TestStartStop(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r, transport := e.runner(t)
	select {
	case <-r.Running():
	default:
		t.Fatal("Start returned before the subscriptions were ready")
	}
	require.ErrorContains(t, r.Start(context.Background()), "already started")
	e.publish(t, transport, "i-1")
	require.Eventually(t, func() bool { return e.items(t) == 1 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, r.Stop(context.Background()))
	select {
	case <-r.Stopped():
	default:
		t.Fatal("Stop returned before the router stopped")
	}
}

// TestStopWaitsForAttemptInFlight: Stop closes the intake, then waits for
// the attempt in flight, which finishes and commits.
func TestStopWaitsForAttemptInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	entered, release := make(chan struct{}), make(chan struct{})
	hold := func(ctx context.Context) error {
		close(entered)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.hold.Store(&hold)
	// A time limit that a loaded machine's Stop does not outlast before
	// it closes the intake.
	r, transport := e.runner(t, time.Minute)
	e.publish(t, transport, "i-1")
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(context.Background()) }()
	require.Eventually(t, r.stoppingNow, 10*time.Second, time.Millisecond, "Stop did not close the intake")
	close(release)
	require.NoError(t, <-stopped)
	require.Equal(t, 1, e.items(t), "the attempt in flight was not let finish")
}

// TestStopExpiredCancelsAttempt: Stop whose context has ended cancels the
// attempt in flight, which rolls back; the message is not lost: a runner
// started later handles it.
func TestStopExpiredCancelsAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	entered := make(chan struct{})
	hold := func(ctx context.Context) error {
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	}
	e.hold.Store(&hold)
	// A time limit that a loaded machine does not reach before Stop: at
	// a second, the attempt once timed out first and, with one attempt,
	// was dead-lettered. The canceled attempt's message is delivered
	// again without waiting for its lease to end.
	r, transport := e.runner(t, 20*time.Second)
	e.publish(t, transport, "i-1")
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, r.Stop(ctx), context.Canceled)
	require.Zero(t, e.items(t), "the canceled attempt did not roll back")

	e.hold.Store(nil)
	e.runner(t)
	require.Eventually(t, func() bool { return e.items(t) == 1 }, 30*time.Second, 10*time.Millisecond, "the message was lost")
}

// TestNewRefusesBadSettings: New refuses a consumer's invalid setting,
// naming the consumer and the field, whichever part checks it: the
// runner (its timeout sizes the leases), the chain or the unit of work.
func TestNewRefusesBadSettings(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	transport, err := sqlite.New(e.db, sqlite.TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = transport.Close() })
	for want, cc := range map[string]ConsumerConfig{
		"Config.Consumers[0]: ConsumerConfig.Settings.timeout: must be positive":                     {Settings: middleware.Settings{Timeout: -time.Second}},
		"Config.Consumers[0]: ConsumerConfig.Settings.attempts: want 1 or more, got -1":              {Settings: middleware.Settings{Attempts: -1}},
		"Config.Consumers[0]: ConsumerConfig.Settings.rate_limit: want 0 (no limit) or more":         {Settings: middleware.Settings{RateLimit: -1}},
		"Config.Consumers[0]: ConsumerConfig.Settings.batch_size: want 1..64, got -2":                {Settings: middleware.Settings{BatchSize: -2}},
		"Config.Consumers[0]: ConsumerConfig.Settings.partitions: want 1..64, got 65":                {Settings: middleware.Settings{Partitions: 65}},
		"partitions: 4: the sqlite transport does not partition: the file has one writer":            {Settings: middleware.Settings{Partitions: 4}},
		"Config.Consumers[0]: ConsumerConfig.Settings.batch_linger: must not be negative":            {Settings: middleware.Settings{BatchLinger: -time.Second}},
		"Config.Consumers[0]: ConsumerConfig.Settings.batch_linger: want less than its timeout (1s)": {Settings: middleware.Settings{Timeout: time.Second, BatchLinger: time.Second}},
		"Config.Consumers[0]: ConsumerConfig.Settings: attempts × (timeout + retry_delay) + breaker.max_hold: want at most 8760h0m0s": {
			Settings: middleware.Settings{
				Attempts:   1 << 30,
				Timeout:    time.Hour,
				RetryDelay: time.Hour,
			},
		},
	} {
		cc.Consumer = e.consumer
		_, err := New(Config{Consumers: []ConsumerConfig{cc}, Transport: transport, DB: e.db, Store: e.store})
		require.ErrorContains(t, err, want)
	}
}

// TestAckInTheTransaction: on the SQLite transport sharing the stores'
// database, the runner's chain acknowledges each message inside the
// transaction of its attempt (the subscriber is its
// middleware.Config.Acker): the message's lease is gone once the effect
// committed, before the runner acks the message. And the runner settles
// each message itself: it tells the subscriber, a driver.Settler,
// every outcome, for every router handler of the consumer.
func TestAckInTheTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	leases := make(chan int, 1)
	hold := func(ctx context.Context) error {
		tx, ok := driver.TxFromContext(ctx)
		require.True(t, ok)
		tx.OnCommit(func() {
			var n int
			if err := e.db.Get(&n, `SELECT count(*) FROM `+sqlite.PubSubLeasesTable); err != nil {
				n = -1
			}
			leases <- n
		})
		return nil
	}
	e.hold.Store(&hold)
	r, transport := e.runner(t)
	require.NotEmpty(t, r.settlers)
	for _, s := range r.subs {
		for i := range s.sub.Topics {
			require.Same(t, s.sub.Subscriber, r.settlers[handlerName(s.consumer, s.sub.Topics, i)])
		}
	}
	e.publish(t, transport, "i-1")
	select {
	case n := <-leases:
		require.Zero(t, n, "the lease went with the effect's commit")
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not run")
	}
}

// TestSettleWithoutSettler: a message of a handler whose subscriber is
// no driver.Settler is left to the router, which acks or nacks it.
func TestSettleWithoutSettler(t *testing.T) {
	t.Parallel()
	r := &Runner{settlers: map[string]driver.Settler{}}
	msg := message.NewMessage("1", nil)
	r.settle(msg, nil)
	select {
	case <-msg.Acked():
		t.Fatal("settle acked a message of no Settler: the router acks it")
	default:
	}
}
