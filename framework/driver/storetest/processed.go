package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

func exerciseProcessed(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "billing.charge-on-order-placed"
	key := framework.Key{Source: "orders", ID: "order-1"}

	t.Run("MarkThenDuplicateAfterCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		var calls atomic.Int32
		fn := func(ctx context.Context) error {
			calls.Add(1)
			return b.effects.write(ctx, "charge")
		}

		out, err := b.do(ctx, b.uow, consumer, key, fn)
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)

		out, err = b.do(ctx, b.uow, consumer, key, fn)
		require.NoError(t, err)
		require.Equal(t, framework.Duplicate, out)
		require.EqualValues(t, 1, calls.Load())
		require.Equal(t, 1, b.effects.count(t, "charge"))
	})

	t.Run("RolledBackMarkIsReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()

		out, err := b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
			require.NoError(t, b.effects.write(ctx, "charge"))
			return errBoom
		})
		require.ErrorIs(t, err, errBoom)
		require.Equal(t, framework.Failed, out)
		require.Equal(t, 0, b.effects.count(t, "charge"))

		out, err = b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
			return b.effects.write(ctx, "charge")
		})
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)
		require.Equal(t, 1, b.effects.count(t, "charge"))
	})

	t.Run("PanicRollsBackTheMark", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()

		require.Panics(t, func() {
			_, _ = b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
				require.NoError(t, b.effects.write(ctx, "charge"))
				panic("handler bug")
			})
		})
		out, err := b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
			return b.effects.write(ctx, "charge")
		})
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)
		require.Equal(t, 1, b.effects.count(t, "charge"))
	})

	t.Run("KeysAreDistinct", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		cases := []struct {
			consumer string
			key      framework.Key
		}{
			{consumer, framework.Key{Source: "orders", ID: "1"}},
			{consumer, framework.Key{Source: "payments", ID: "1"}},
			{consumer, framework.Key{Source: "orders", ID: "2"}},
			{"billing.other", framework.Key{Source: "orders", ID: "1"}},
			{consumer, framework.Key{ID: "1"}},
		}
		for _, c := range cases {
			out, err := b.do(ctx, b.uow, c.consumer, c.key, func(ctx context.Context) error { return nil })
			require.NoError(t, err)
			require.Equal(t, framework.Processed, out, "%s %s", c.consumer, c.key)
		}
		for _, c := range cases {
			out, err := b.do(ctx, b.uow, c.consumer, c.key, func(ctx context.Context) error { return nil })
			require.NoError(t, err)
			require.Equal(t, framework.Duplicate, out, "%s %s", c.consumer, c.key)
		}
	})

	t.Run("ConcurrentMarksProcessOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		const workers = 8
		var (
			wg         sync.WaitGroup
			start      = make(chan struct{})
			calls      atomic.Int32
			processed  atomic.Int32
			duplicates atomic.Int32
			errs       = make(chan error, workers)
		)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				out, err := b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
					calls.Add(1)
					return b.effects.write(ctx, "charge")
				})
				if err != nil {
					errs <- err
					return
				}
				switch out {
				case framework.Processed:
					processed.Add(1)
				case framework.Duplicate:
					duplicates.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.EqualValues(t, 1, processed.Load())
		require.EqualValues(t, workers-1, duplicates.Load())
		require.EqualValues(t, 1, calls.Load())
		require.Equal(t, 1, b.effects.count(t, "charge"))
	})

	// holdMark starts an attempt that holds the mark of key until release
	// is closed, then ends as end says. It returns when the mark is held.
	holdMark := func(t *testing.T, b *bundle, end error, release <-chan struct{}) <-chan error {
		t.Helper()
		held := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			out, err := b.do(context.Background(), b.uow, consumer, key, func(ctx context.Context) error {
				if err := b.effects.write(ctx, "holder"); err != nil {
					return err
				}
				close(held)
				<-release
				return end
			})
			if err == nil && out != framework.Processed {
				err = fmt.Errorf("holder: outcome %s", out)
			}
			done <- err
		}()
		select {
		case <-held:
		case err := <-done:
			t.Fatalf("holder ended before it held the mark: %v", err)
		}
		return done
	}

	type result struct {
		out framework.Outcome
		err error
	}
	// wait starts an attempt on key, which should wait for the holder.
	wait := func(ctx context.Context, b *bundle) <-chan result {
		done := make(chan result, 1)
		go func() {
			out, err := b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
				return b.effects.write(ctx, "waiter")
			})
			done <- result{out, err}
		}()
		return done
	}
	requireWaiting := func(t *testing.T, waiter <-chan result) {
		t.Helper()
		select {
		case r := <-waiter:
			t.Fatalf("the waiter did not wait for the holder: %s, %v", r.out, r.err)
		case <-time.After(200 * time.Millisecond):
		}
	}

	t.Run("WaiterClaimsMarkAfterHolderRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		release := make(chan struct{})
		holder := holdMark(t, b, errBoom, release)
		waiter := wait(context.Background(), b)
		requireWaiting(t, waiter)

		close(release)
		require.ErrorIs(t, <-holder, errBoom)
		r := <-waiter
		require.NoError(t, r.err)
		require.Equal(t, framework.Processed, r.out)
		require.Equal(t, 0, b.effects.count(t, "holder"))
		require.Equal(t, 1, b.effects.count(t, "waiter"))
	})

	t.Run("WaiterFindsDuplicateAfterHolderCommits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		release := make(chan struct{})
		holder := holdMark(t, b, nil, release)
		waiter := wait(context.Background(), b)
		requireWaiting(t, waiter)

		close(release)
		require.NoError(t, <-holder)
		r := <-waiter
		require.NoError(t, r.err)
		require.Equal(t, framework.Duplicate, r.out)
		require.Equal(t, 1, b.effects.count(t, "holder"))
		require.Equal(t, 0, b.effects.count(t, "waiter"))
	})

	t.Run("WaiterGivesUpWhenContextEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		release := make(chan struct{})
		holder := holdMark(t, b, nil, release)
		defer func() {
			close(release)
			require.NoError(t, <-holder)
		}()

		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		select {
		case r := <-wait(ctx, b):
			require.Error(t, r.err)
			require.Equal(t, framework.Failed, r.out)
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter did not give up when its context ended")
		}
		require.Equal(t, 0, b.effects.count(t, "waiter"))
	})
}
