package runner_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// TestSQLiteBreakerHoldKeepsLease: on the SQLite transport a message that
// waits at an open breaker for more than two of its leases (4s: twice the
// attempt timeout) keeps its lease, which the transport renews while the
// message is held: no second copy of it is handed out meanwhile, though
// the consumer has room for one.
func TestSQLiteBreakerHoldKeepsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, testenv.SQLitePath(t), sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	tr, err := sqlite.New(db, sqlite.TransportConfig{Subscriber: sqlite.SubscriberConfig{
		PollInterval: 20 * time.Millisecond,
		NackDelay:    20 * time.Millisecond,
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })

	var (
		outage  atomic.Bool
		mu      sync.Mutex
		passes  = map[string]int{} // deliveries past the breaker, by event id
		handled = map[string]int{}
	)
	outage.Store(true)
	c, err := framework.NewConsumer("lease.breaker", framework.Handle(Captured, func(_ context.Context, ev framework.Event[PaymentCaptured]) error {
		if outage.Load() {
			return framework.Dependency(errors.New("ledger down"))
		}
		mu.Lock()
		defer mu.Unlock()
		handled[ev.ID]++
		return nil
	}))
	require.NoError(t, err)
	count := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d, _ := framework.EnvelopeFromContext(msg.Context())
			mu.Lock()
			passes[d.ID]++
			mu.Unlock()
			return next(msg)
		}
	}
	metrics, err := middleware.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	r, err := runner.New(runner.Config{
		Consumers: []runner.ConsumerConfig{{
			Consumer: c, Settings: middleware.Settings{
				Attempts: 1,
				// An attempt's time limit that a loaded machine does not
				// reach: an attempt that timed out would be dead-lettered,
				// uncounted by the breaker (see TestStopExpiredCancelsAttempt,
				// whose 1s limit was once reached).
				Timeout:     2 * time.Second,
				Concurrency: 4,
				Breaker:     middleware.BreakerConfig{Failures: 1, CoolDown: 9 * time.Second, MaxHold: 12 * time.Second},
			},
		}},
		Transport: tr, DB: db, Store: store, Metrics: metrics,
		Outer: []message.HandlerMiddleware{count},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(ctx) })
	publish := func(id string) {
		t.Helper()
		env, err := Captured.Envelope(PaymentCaptured{OrderID: id, Cents: 100}, framework.Attributes{ID: id, Source: "payments"})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NoError(t, tr.Publisher().Publish(Captured.Type(), msg))
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("no %s within 30s: passes %v, handled %v, breaker %v", what, passes, handled, metrics.Breakers()[0].State)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	publish("p-1") // fails: the breaker opens for 9s
	waitFor("the breaker open", func() bool { return metrics.Breakers()[0].State == middleware.BreakerOpen })
	publish("p-2") // waits at the breaker until the cool-down ends
	outage.Store(false)
	waitFor("both payments", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["p-1"] == 1 && handled["p-2"] == 1
	})
	require.NoError(t, r.Stop(ctx))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, passes["p-2"], "one copy of p-2 came past the breaker: its lease held while it waited")
	require.Equal(t, middleware.BreakerClosed, metrics.Breakers()[0].State)
}
