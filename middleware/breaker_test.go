package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/middleware"
)

// fakeClock is a clock that moves only when the test moves it: After
// reports each wait on waits, and its channel fires when Advance passes
// its time.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
	waits  chan time.Duration
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC), waits: make(chan time.Duration, 100)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
	} else {
		c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	}
	c.waits <- d
	return ch
}

// Advance moves the clock by d and fires the timers due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	left := c.timers[:0]
	for _, tm := range c.timers {
		if tm.at.After(c.now) {
			left = append(left, tm)
			continue
		}
		tm.ch <- c.now
	}
	c.timers = left
}

// breakerKit is one consumer's chain with a breaker, on a clock of the
// test's. The handler does what the test sends on results, after telling
// entered the event's id; "ok" events succeed at once.
type breakerKit struct {
	h       message.NoPublishHandlerFunc
	clk     *fakeClock
	db      *sqlx.DB
	store   driver.Store
	metrics *middleware.Metrics
	name    string
	entered chan string
	results chan error
}

func newBreakerKit(t *testing.T, db *sqlx.DB, store driver.Store, uc driver.UnitOfWorkConfig, metrics *middleware.Metrics, name string, bc middleware.BreakerConfig, opts ...func(*middleware.Config)) *breakerKit {
	t.Helper()
	uc.DB, uc.Store = db, store
	uow, err := driver.NewUnitOfWork(uc)
	require.NoError(t, err)
	k := &breakerKit{
		clk: newFakeClock(), db: db, store: store, metrics: metrics, name: name,
		entered: make(chan string, 10), results: make(chan error),
	}
	c, err := framework.NewConsumer(name, framework.Handle(noted, func(_ context.Context, ev framework.Event[noteV1]) error {
		switch ev.Data.Text {
		case "ok":
			return nil
		case "fail":
			return framework.Dependency(errors.New("stock service unavailable"))
		}
		k.entered <- ev.ID
		return <-k.results
	}))
	require.NoError(t, err)
	cfg := middleware.Config{
		Consumer: c, UnitOfWork: uow, Store: store, Metrics: metrics,
		Settings: middleware.Settings{
			Attempts: 1,
			Breaker:  bc,
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	k.h, err = middleware.HandlerOnClock(cfg, middleware.TestClock{Now: k.clk.Now, After: k.clk.After})
	require.NoError(t, err)
	return k
}

// delivery is a message on its way through the chain.
type delivery struct {
	msg  *message.Message
	key  framework.Key
	done chan error
}

// deliver hands an event with id and text to the chain, marked as a
// redelivery when redelivered (so the delivery guard counts it).
func (k *breakerKit) deliver(t *testing.T, id, text string, redelivered bool) delivery {
	t.Helper()
	env, err := noted.Envelope(noteV1{Text: text}, framework.Attributes{ID: id, Source: "notes"})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	msg.Metadata.Set(pipeline.MetadataRedelivered, fmt.Sprint(redelivered))
	msg.SetContext(context.Background())
	d := delivery{msg: msg, key: env.Key(), done: make(chan error, 1)}
	go func() { d.done <- k.h(msg) }()
	return d
}

// handled waits for d to end and returns what became of it.
func (k *breakerKit) handled(t *testing.T, d delivery) (middleware.Report, error) {
	t.Helper()
	err := <-d.done
	r, ok := middleware.ReportOf(d.msg)
	require.True(t, ok)
	return r, err
}

// held waits until a delivery waits at the breaker, and returns how long
// it waits; it fails when d ends instead.
func (k *breakerKit) held(t *testing.T, d delivery) time.Duration {
	t.Helper()
	select {
	case w := <-k.clk.waits:
		return w
	case err := <-d.done:
		t.Fatalf("%s went through the breaker (err %v)", d.key, err)
		return 0
	}
}

// state returns the breaker's state as Metrics reports it.
func (k *breakerKit) state(t *testing.T) middleware.BreakerState {
	t.Helper()
	for _, s := range k.metrics.Breakers() {
		if s.Consumer == k.name {
			return s.State
		}
	}
	t.Fatalf("no breaker for %s", k.name)
	return 0
}

func (k *breakerKit) deadLetters(t *testing.T) []driver.DeadLetter {
	t.Helper()
	dls, err := k.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: k.name})
	require.NoError(t, err)
	return dls
}

// fail delivers a failing event and waits for its end: its only attempt
// fails, so it is dead-lettered (retries exhausted), by the retries, not
// by the breaker.
func (k *breakerKit) fail(t *testing.T, id string) {
	t.Helper()
	r, err := k.handled(t, k.deliver(t, id, "fail", false))
	require.NoError(t, err)
	require.Equal(t, framework.CodeRetriesExhausted, r.Code)
}

// failOpening delivers a failing event whose failure opens the breaker:
// it is nacked to come back later, not dead-lettered.
func (k *breakerKit) failOpening(t *testing.T, id string) {
	t.Helper()
	r, err := k.handled(t, k.deliver(t, id, "fail", false))
	requireLater(t, r, err)
	require.Equal(t, 1, r.Attempts, "no attempt after the one that opened the breaker")
}

// requireLater checks that a message was nacked, to be delivered again
// later, without a dead letter.
func requireLater(t *testing.T, r middleware.Report, err error) {
	t.Helper()
	require.ErrorIs(t, err, pipeline.ErrLater)
	require.Equal(t, framework.Nacked, r.Outcome)
	require.Empty(t, r.Code)
}

func breakerSetup(t *testing.T, b backend, bc middleware.BreakerConfig, uc driver.UnitOfWorkConfig, opts ...func(*middleware.Config)) *breakerKit {
	t.Helper()
	db, store := b.open(t, nil)
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	metrics, err := middleware.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	return newBreakerKit(t, db, store, uc, metrics, consumerName, bc, opts...)
}

// TestBreakerOpensHoldsAndReleases: failures in a row open the breaker;
// a message arriving then waits, is not counted as a delivery, and is
// released (nacked, not dead-lettered) at MaxHold; after the cool-down a
// probe closes the breaker, whose count of failures starts anew. Another
// consumer keeps running meanwhile.
func TestBreakerOpensHoldsAndReleases(t *testing.T) {
	t.Parallel()
	k := breakerSetup(t, backends[0], middleware.BreakerConfig{Failures: 2, CoolDown: 2 * time.Minute, MaxHold: time.Minute}, driver.UnitOfWorkConfig{})
	other := newBreakerKit(t, k.db, k.store, driver.UnitOfWorkConfig{}, k.metrics, "notes.other", middleware.BreakerConfig{Failures: 2})

	k.fail(t, "1")
	require.Equal(t, middleware.BreakerClosed, k.state(t), "one failure of two")
	k.failOpening(t, "2")
	require.Equal(t, middleware.BreakerOpen, k.state(t))

	// A redelivery, which the delivery guard would count, waits.
	held := k.deliver(t, "3", "ok", true)
	require.Equal(t, time.Minute, k.held(t, held), "it waits up to MaxHold, before the cool-down ends")

	// Another consumer is not held.
	r, err := other.handled(t, other.deliver(t, "9", "ok", false))
	require.NoError(t, err)
	require.Equal(t, framework.Processed, r.Outcome)
	require.Equal(t, middleware.BreakerClosed, other.state(t))

	// At MaxHold it is released: nacked, to be delivered again.
	k.clk.Advance(time.Minute)
	r, err = k.handled(t, held)
	requireLater(t, r, err)
	require.Zero(t, r.Attempts)
	require.Len(t, k.deadLetters(t), 1, "only the failure before the breaker opened is dead-lettered")
	n, err := k.store.Count(context.Background(), consumerName, held.key, 2)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the held redelivery was not counted")
	require.Equal(t, middleware.BreakerOpen, k.state(t), "the release is no failure, nor does it close")

	// The cool-down over, the next message is the probe: it succeeds and
	// closes the breaker.
	k.clk.Advance(time.Minute)
	r, err = k.handled(t, k.deliver(t, "4", "ok", false))
	require.NoError(t, err)
	require.Equal(t, framework.Processed, r.Outcome)
	require.Equal(t, middleware.BreakerClosed, k.state(t))

	// The count starts anew: one failure leaves it closed.
	k.fail(t, "5")
	require.Equal(t, middleware.BreakerClosed, k.state(t))
	k.failOpening(t, "6")
	require.Equal(t, middleware.BreakerOpen, k.state(t))
}

// TestBreakerEndsRetries: the attempt that opens the breaker ends its
// message's retries: it is nacked, to wait at the breaker when it comes
// back, instead of spending its attempts and being dead-lettered.
func TestBreakerEndsRetries(t *testing.T) {
	t.Parallel()
	k := breakerSetup(t, backends[0], middleware.BreakerConfig{Failures: 2}, driver.UnitOfWorkConfig{}, func(cfg *middleware.Config) {
		cfg.Attempts, cfg.RetryDelay = 5, time.Millisecond
	})
	r, err := k.handled(t, k.deliver(t, "1", "fail", false))
	requireLater(t, r, err)
	require.Equal(t, 2, r.Attempts, "its second failure in a row opened the breaker")
	require.Equal(t, middleware.BreakerOpen, k.state(t))
	require.Empty(t, k.deadLetters(t))
}

// TestBreakerProbe: after the cool-down one message goes through while
// the others wait; its failure opens the breaker again for a cool-down
// (the probe comes back later, not dead-lettered), the next probe's
// success closes it and the held message flows.
func TestBreakerProbe(t *testing.T) {
	t.Parallel()
	k := breakerSetup(t, backends[0], middleware.BreakerConfig{Failures: 1, CoolDown: 20 * time.Second, MaxHold: time.Minute}, driver.UnitOfWorkConfig{})
	k.failOpening(t, "1")
	require.Equal(t, middleware.BreakerOpen, k.state(t))

	a, b := k.deliver(t, "a", "probe", false), k.deliver(t, "b", "probe", false)
	require.Equal(t, 20*time.Second, k.held(t, a), "waits for the cool-down")
	require.Equal(t, 20*time.Second, k.held(t, b), "waits for the cool-down")

	// Cool-down over: one goes through, the other waits for it, up to
	// MaxHold (40s left).
	k.clk.Advance(20 * time.Second)
	first := <-k.entered
	require.Equal(t, 40*time.Second, <-k.clk.waits)
	require.Equal(t, middleware.BreakerHalfOpen, k.state(t))

	// The probe fails: open again for a cool-down.
	k.results <- framework.Dependency(errors.New("still down"))
	require.Equal(t, 20*time.Second, <-k.clk.waits, "the other waits for the new cool-down")
	require.Equal(t, middleware.BreakerOpen, k.state(t))
	probe, rest := a, b
	if first == "b" {
		probe, rest = b, a
	}
	r, err := k.handled(t, probe)
	requireLater(t, r, err)
	require.Empty(t, k.deadLetters(t), "the failed probe comes back later")

	// The next cool-down over, the other is the probe: it succeeds.
	k.clk.Advance(20 * time.Second)
	require.NotEqual(t, first, <-k.entered)
	k.results <- nil
	r, err = k.handled(t, rest)
	require.NoError(t, err)
	require.Equal(t, framework.Processed, r.Outcome)
	require.Equal(t, middleware.BreakerClosed, k.state(t))
	r, err = k.handled(t, k.deliver(t, "c", "ok", false))
	require.NoError(t, err)
	require.Equal(t, framework.Processed, r.Outcome)
}

// TestBreakerBatchCountsOnce: under group commit, the attempts of a batch
// that fails count as one failure, on SQLite and PostgreSQL.
func TestBreakerBatchCountsOnce(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			// The batch starts once it holds 3 attempts (the linger
			// only bounds a broken test).
			k := breakerSetup(t, be, middleware.BreakerConfig{Failures: 2}, driver.UnitOfWorkConfig{BatchSize: 3, Batches: 1, Linger: time.Minute})
			batch := func(text string) []delivery {
				var ds []delivery
				for i := range 3 {
					ds = append(ds, k.deliver(t, fmt.Sprint(text, i), text, false))
				}
				return ds
			}
			for _, d := range batch("fail") {
				r, err := k.handled(t, d)
				require.NoError(t, err)
				require.Equal(t, framework.CodeRetriesExhausted, r.Code)
			}
			require.Equal(t, middleware.BreakerClosed, k.state(t), "three failures of one batch count once")
			for _, d := range batch("ok") {
				select {
				case w := <-k.clk.waits:
					t.Fatalf("a message waits %s at the breaker", w)
				case err := <-d.done:
					require.NoError(t, err)
				}
			}
		})
	}
}

// TestBreakerConfig: the breaker's settings are checked, each error
// naming its field.
func TestBreakerConfig(t *testing.T) {
	t.Parallel()
	db, store := backends[0].open(t, nil) // SQLite
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store})
	require.NoError(t, err)
	c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(context.Context, framework.Event[noteV1]) error { return nil }))
	require.NoError(t, err)
	for _, tc := range []struct {
		bc   middleware.BreakerConfig
		want string
	}{
		{middleware.BreakerConfig{Failures: -1}, "Config.Settings.breaker.failures: want 1 or more"},
		{middleware.BreakerConfig{Failures: 1, CoolDown: -time.Second}, "Config.Settings.breaker.cool_down: must be positive"},
		{middleware.BreakerConfig{Failures: 1, MaxHold: time.Hour}, "Config.Settings.breaker.max_hold: want more than 0 and at most 10m0s"},
	} {
		_, _, err := middleware.Handler(middleware.Config{Consumer: c, UnitOfWork: uow, Store: store, Settings: middleware.Settings{Breaker: tc.bc}})
		require.ErrorContains(t, err, tc.want)
	}
}
