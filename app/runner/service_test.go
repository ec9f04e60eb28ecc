package runner_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// Receipt is the follow-up event of a captured payment, published through
// the outbox.
type Receipt struct {
	OrderID string `json:"orderId" validate:"required"`
}

var Receipted = framework.Define[Receipt]("billing.receipt.sent", 1)

// serviceEnv is a database, its store and a transport, for a service
// built on a runner alone.
type serviceEnv struct {
	db        *sqlx.DB
	store     driver.Store
	transport driver.Transport
	// ph is the placeholder of the database's statements ("?" or "$1").
	ph string
}

// TestService runs a whole service on a runner alone, with no fx and no
// app package, on a real store: a message its handler refuses becomes a
// dead letter (counted by the runner's gauges); an operator resolves it
// as replayed, as the dead-letters replay command does, and the runner's
// replay relay delivers it to the fixed handler, whose effect commits
// with a follow-up event in the outbox, which the runner's outbox relay
// publishes to a second consumer.
func TestService(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		db, err := sqlite.Open(context.Background(), testenv.SQLitePath(t), sqlite.OpenConfig{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
		require.NoError(t, err)
		tr, err := sqlite.New(db, sqlite.TransportConfig{Subscriber: sqlite.SubscriberConfig{
			PollInterval: 20 * time.Millisecond,
			NackDelay:    20 * time.Millisecond,
		}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		testService(t, serviceEnv{db: db, store: store, transport: tr, ph: "?"})
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		url := testenv.PostgresURL(t)
		db, err := postgres.Open(context.Background(), url, postgres.OpenConfig{MaxOpenConns: 20})
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		store, err := postgres.NewStore(db, postgres.StoreConfig{})
		require.NoError(t, err)
		tr, err := postgres.New(context.Background(), db, postgres.TransportConfig{URL: url, PollInterval: 20 * time.Millisecond, ResendInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		testService(t, serviceEnv{db: db, store: store, transport: tr, ph: "$1"})
	})
}

func testService(t *testing.T, env serviceEnv) {
	ctx := t.Context()
	require.NoError(t, migrate.Up(ctx, env.db, migrate.Config{}))
	_, err := env.db.ExecContext(ctx, `CREATE TABLE ledger (order_id TEXT)`)
	require.NoError(t, err)
	_, err = env.db.ExecContext(ctx, `CREATE TABLE receipts (order_id TEXT)`)
	require.NoError(t, err)
	box, err := outbox.New(env.db, outbox.Config{})
	require.NoError(t, err)

	var broken atomic.Bool // the handler's bug, until it is fixed
	broken.Store(true)
	ledger, err := framework.NewConsumer("billing.ledger",
		framework.Handle(Captured, func(ctx context.Context, ev framework.Event[PaymentCaptured]) error {
			if broken.Load() {
				return framework.Permanent("ledger_bug", errors.New("the ledger refuses every payment"))
			}
			if _, err := framework.Conn(ctx, env.db).ExecContext(ctx,
				`INSERT INTO ledger (order_id) VALUES (`+env.ph+`)`, ev.Data.OrderID); err != nil {
				return err
			}
			receipt, err := Receipted.Envelope(Receipt{OrderID: ev.Data.OrderID}, framework.Attributes{ID: "receipt-" + ev.Data.OrderID, Source: "billing"})
			if err != nil {
				return err
			}
			return box.Add(ctx, receipt) // in the attempt's transaction
		}),
	)
	require.NoError(t, err)
	mailer, err := framework.NewConsumer("billing.mailer",
		framework.Handle(Receipted, func(ctx context.Context, ev framework.Event[Receipt]) error {
			_, err := framework.Conn(ctx, env.db).ExecContext(ctx,
				`INSERT INTO receipts (order_id) VALUES (`+env.ph+`)`, ev.Data.OrderID)
			return err
		}),
	)
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	r, err := runner.New(runner.Config{
		Consumers:   []runner.ConsumerConfig{{Consumer: ledger, Settings: middleware.Settings{Attempts: 2, RetryDelay: time.Millisecond}}, {Consumer: mailer}},
		Transport:   env.transport,
		DB:          env.db,
		Store:       env.store,
		OutboxRelay: outbox.RelayConfig{Outbox: box},
		Registerer:  reg,
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(stopCtx))
	}
	t.Cleanup(stop)

	count := func(table string) int {
		var n int
		require.NoError(t, env.db.GetContext(ctx, &n, `SELECT count(*) FROM `+table))
		return n
	}
	ev, err := Captured.Envelope(PaymentCaptured{OrderID: "o-1", Cents: 100}, framework.Attributes{ID: "evt-1", Source: "payments"})
	require.NoError(t, err)
	msg, err := framework.NewMessage(ev)
	require.NoError(t, err)
	require.NoError(t, env.transport.Publisher().Publish(Captured.Type(), msg))

	var dl driver.DeadLetter
	require.Eventually(t, func() bool {
		dls, err := env.store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: ledger.Name()})
		require.NoError(t, err)
		if len(dls) == 1 {
			dl = dls[0]
		}
		return len(dls) == 1
	}, 30*time.Second, 10*time.Millisecond, "the refused payment became a dead letter")
	require.Equal(t, framework.Code("ledger_bug"), dl.Code)
	require.Zero(t, count("ledger"))
	require.Eventually(t, func() bool {
		n, _ := pending(t, reg, ledger.Name(), "ledger_bug")
		return n == 1
	}, 30*time.Second, 50*time.Millisecond, "the runner's gauges count the pending dead letter")

	// The fix is deployed; an operator replays the dead letter, as
	// effectively dead-letters replay does: in the database alone.
	broken.Store(false)
	_, err = env.store.ResolveDeadLetter(ctx, dl.ID, driver.Resolution{
		Status: driver.DeadLetterReplayed, By: "ops", Reason: "ledger fixed", At: time.Now().UTC(),
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return count("ledger") == 1 }, 30*time.Second, 10*time.Millisecond,
		"the runner's replay relay delivered the replay to the fixed handler")
	require.Eventually(t, func() bool { return count("receipts") == 1 }, 30*time.Second, 10*time.Millisecond,
		"the runner's outbox relay published the follow-up event")
	left, err := env.store.ClaimReplays(ctx, 10, time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, left, "the replay is recorded sent")

	stop()
	_, registered := pending(t, reg, ledger.Name(), "ledger_bug")
	require.False(t, registered, "Stop unregisters the gauges")
	require.Equal(t, 1, count("ledger"))
	require.Equal(t, 1, count("receipts"))
}

// pending returns the gauge effectively_dead_letters_pending of consumer
// and code in a scrape of reg, and whether the scrape has the gauge.
func pending(t *testing.T, reg *prometheus.Registry, consumer, code string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "effectively_dead_letters_pending" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["consumer"] == consumer && labels["code"] == code {
				return m.GetGauge().GetValue(), true
			}
		}
		return 0, true
	}
	return 0, false
}

// TestStopPublishesWhatTheDrainCommitted: an attempt in flight when Stop
// begins commits an event to the outbox while the consumers drain; the
// outbox relay, which stops after them, has published it when Stop
// returns.
func TestStopPublishesWhatTheDrainCommitted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := sqlite.Open(context.Background(), testenv.SQLitePath(t), sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	tr, err := sqlite.New(db, sqlite.TransportConfig{Subscriber: sqlite.SubscriberConfig{PollInterval: 20 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	box, err := outbox.New(db, outbox.Config{})
	require.NoError(t, err)

	entered, release := make(chan struct{}), make(chan struct{})
	consumer, err := framework.NewConsumer("billing.ledger",
		framework.Handle(Captured, func(ctx context.Context, ev framework.Event[PaymentCaptured]) error {
			close(entered)
			<-release // until Stop began
			receipt, err := Receipted.Envelope(Receipt{OrderID: ev.Data.OrderID}, framework.Attributes{ID: "receipt-1", Source: "billing"})
			if err != nil {
				return err
			}
			return box.Add(ctx, receipt)
		}),
	)
	require.NoError(t, err)
	r, err := runner.New(runner.Config{
		Consumers:   []runner.ConsumerConfig{{Consumer: consumer}},
		Transport:   tr,
		DB:          db,
		Store:       store,
		OutboxRelay: outbox.RelayConfig{Outbox: box, PollInterval: time.Hour}, // woken by the Add alone
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))

	ev, err := Captured.Envelope(PaymentCaptured{OrderID: "o-1", Cents: 100}, framework.Attributes{ID: "evt-1", Source: "payments"})
	require.NoError(t, err)
	msg, err := framework.NewMessage(ev)
	require.NoError(t, err)
	require.NoError(t, tr.Publisher().Publish(Captured.Type(), msg))
	<-entered

	stopped := make(chan error, 1)
	go func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- r.Stop(stopCtx)
	}()
	time.Sleep(100 * time.Millisecond) // Stop closed the intake and waits for the attempt
	close(release)
	require.NoError(t, <-stopped)

	var unsent, sent int
	require.NoError(t, db.GetContext(ctx, &unsent, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`))
	require.NoError(t, db.GetContext(ctx, &sent, `SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL`))
	require.Equal(t, 0, unsent, "the event committed while draining was published before Stop returned")
	require.Equal(t, 1, sent)
}

// TestServiceConfig: New refuses a bad service-level setting, naming the
// field.
func TestServiceConfig(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	require.NoError(t, migrate.Up(t.Context(), db, migrate.Config{}))
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	tr, err := sqlite.New(db, sqlite.TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	base := runner.Config{Transport: tr, DB: db, Store: store}
	otherBox, err := outbox.New(testenv.SQLite(t), outbox.Config{})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	first := base
	first.Registerer = reg
	_, err = runner.New(first)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		set  func(*runner.Config)
		want string
	}{
		{"ProcessedRetentionShort", func(c *runner.Config) { c.ProcessedRetention = time.Minute }, "Config.ProcessedRetention: must be zero (kept for ever) or at least 1h0m0s"},
		{"OutboxRetentionNegative", func(c *runner.Config) { c.OutboxRetention = -time.Hour }, "Config.OutboxRetention: must not be negative"},
		{"ReplayRetentionNegative", func(c *runner.Config) { c.ReplayRetention = -time.Hour }, "Config.ReplayRetention: must not be negative"},
		{"DeadLetterRetentionNegative", func(c *runner.Config) { c.DeadLetterRetention = -time.Hour }, "Config.DeadLetterRetention: must not be negative"},
		{"OutboxOfAnotherDB", func(c *runner.Config) { c.OutboxRelay.Outbox = otherBox }, "Config.OutboxRelay: outbox: RelayConfig.Outbox is an outbox of another database"},
		{"GaugesTwice", func(c *runner.Config) { c.Registerer = reg }, "Config.Registerer: the database gauges"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.set(&cfg)
			_, err := runner.New(cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
