package driver

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// attemptsWithContexts returns n attempts, each with a context of its own
// under ctx, and the functions that end them.
func attemptsWithContexts(ctx context.Context, n int) ([]*attemptRun, []context.CancelFunc) {
	batch := make([]*attemptRun, n)
	cancels := make([]context.CancelFunc, n)
	for i := range batch {
		actx, cancel := context.WithCancel(ctx)
		batch[i], cancels[i] = &attemptRun{ctx: actx}, cancel
	}
	return batch, cancels
}

type batchKey struct{}

// TestBatchContext: a batch's context has the first attempt's values and
// ends once every attempt's context has ended, in whatever order they
// end, and not before; its stop ends it too.
func TestBatchContext(t *testing.T) {
	t.Parallel()
	parent := context.WithValue(t.Context(), batchKey{}, "first")
	for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {0, 2, 1}} {
		batch, cancels := attemptsWithContexts(parent, 3)
		ctx, stop := batchContext(batch)
		require.Equal(t, "first", ctx.Value(batchKey{}))
		for _, i := range order[:2] {
			cancels[i]()
		}
		require.Never(t, func() bool { return ctx.Err() != nil }, 50*time.Millisecond, time.Millisecond,
			"order %v: ended while attempt %d's context is alive", order, order[2])
		cancels[order[2]]()
		require.Eventually(t, func() bool { return ctx.Err() != nil }, 5*time.Second, time.Millisecond, "order %v", order)
		stop()
	}

	t.Run("AllEndedBefore", func(t *testing.T) {
		t.Parallel()
		batch, cancels := attemptsWithContexts(t.Context(), 3)
		for _, cancel := range cancels {
			cancel()
		}
		ctx, stop := batchContext(batch)
		defer stop()
		require.Error(t, ctx.Err(), "ended at once")
	})

	t.Run("Stop", func(t *testing.T) {
		t.Parallel()
		batch, cancels := attemptsWithContexts(t.Context(), 3)
		ctx, stop := batchContext(batch)
		cancels[0]()
		stop()
		require.Error(t, ctx.Err())
		for _, cancel := range cancels {
			cancel() // the watches stopped: nothing runs after the stop
		}
	})

	// The attempts' contexts end at once, from goroutines of their own:
	// the batch's context ends, and only once every one of them has.
	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		for range 200 {
			batch, cancels := attemptsWithContexts(t.Context(), 32)
			ctx, stop := batchContext(batch)
			early := make(chan int, 1)
			context.AfterFunc(ctx, func() {
				for i, a := range batch {
					if a.ctx.Err() == nil {
						early <- i
						return
					}
				}
				early <- -1
			})
			var wg sync.WaitGroup
			for _, cancel := range cancels {
				wg.Go(cancel)
			}
			wg.Wait()
			select {
			case i := <-early:
				require.Equal(t, -1, i, "ended while attempt %d's context was alive", i)
			case <-time.After(5 * time.Second):
				t.Fatal("the batch's context did not end")
			}
			stop()
		}
	})
}

// TestFailPastDeadline: a statement of a batch whose attempts' deadlines
// passed under it fails with the batch's context's cancel; the attempt's
// error is its timeout (seen in CI: a slow SET of the batch's statement
// timeout; TestChain's CanceledPastDeadline has the consumer dead-letter
// it as such). An attempt a stop cut short keeps its cancel, and no
// timeout.
func TestFailPastDeadline(t *testing.T) {
	t.Parallel()
	actx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	<-actx.Done()
	a := &attemptRun{ctx: actx}
	ctx, stop := batchContext([]*attemptRun{a})
	defer stop()
	<-ctx.Done()
	a.fail(fmt.Errorf("statement timeout: %w", ctx.Err()))
	require.Equal(t, framework.CodeTimeout, framework.CodeOf(a.err), "%v", a.err)
	require.ErrorContains(t, a.err, "statement timeout: context canceled (past the attempt's deadline: context deadline exceeded)")

	stopped, stopNow := context.WithCancel(t.Context())
	stopNow()
	b := &attemptRun{ctx: stopped}
	b.fail(fmt.Errorf("statement timeout: %w", stopped.Err()))
	require.ErrorIs(t, b.err, context.Canceled, "a stop's cancel stays one")
	require.NotEqual(t, framework.CodeTimeout, framework.CodeOf(b.err))
}
