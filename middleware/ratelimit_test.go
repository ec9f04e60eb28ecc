package middleware_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/middleware"
)

// TestRateLimit runs the chain on a clock of the test's: the clock moves
// only when the test moves it, and a wait ends only when the test ends it.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	db, store := backends[0].open(t, nil) // SQLite
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store})
	require.NoError(t, err)
	var handled atomic.Int64
	c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(context.Context, framework.Event[noteV1]) error {
		handled.Add(1)
		return nil
	}))
	require.NoError(t, err)

	var (
		mu  sync.Mutex
		now = time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)
	)
	waits := make(chan time.Duration, 1) // the waits the chain asks for
	turn := make(chan time.Time)         // ends the wait
	h, err := middleware.HandlerOnClock(middleware.Config{
		Consumer: c, UnitOfWork: uow, Store: store, Settings: middleware.Settings{
			RateLimit: 2,
		},
	}, middleware.TestClock{
		Now:   func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		After: func(d time.Duration) <-chan time.Time { waits <- d; return turn },
	})
	require.NoError(t, err)
	deliver := func(ctx context.Context, id int) <-chan error {
		env, err := noted.Envelope(noteV1{Text: "hello"}, framework.Attributes{ID: fmt.Sprint(id), Source: "notes"})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		msg.SetContext(ctx)
		done := make(chan error, 1)
		go func() { done <- h(msg) }()
		return done
	}
	ctx := context.Background()

	require.NoError(t, <-deliver(ctx, 1), "the first message passes at once")
	require.EqualValues(t, 1, handled.Load())

	// The second, at the same instant, waits half a second (2 a second).
	done := deliver(ctx, 2)
	select {
	case d := <-waits:
		require.Equal(t, 500*time.Millisecond, d)
	case err := <-done:
		t.Fatalf("the second message was handled without waiting for its turn (err %v)", err)
	}
	require.EqualValues(t, 1, handled.Load(), "not handled before its turn")
	turn <- now.Add(500 * time.Millisecond)
	require.NoError(t, <-done)
	require.EqualValues(t, 2, handled.Load())

	// A second later on the clock, the next one passes at once.
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	done = deliver(ctx, 3)
	select {
	case d := <-waits:
		t.Fatalf("the third message waits %s though its turn came", d)
	case err := <-done:
		require.NoError(t, err)
	}
	require.EqualValues(t, 3, handled.Load())

	// One whose context ends while it waits is nacked, unhandled.
	stop, cancel := context.WithCancel(ctx)
	done = deliver(stop, 4)
	select {
	case <-waits:
	case err := <-done:
		t.Fatalf("the fourth message was handled without waiting for its turn (err %v)", err)
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.EqualValues(t, 3, handled.Load())
}
