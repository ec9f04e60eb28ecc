package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

func exerciseDeliveries(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "notifications.remind-on-appointment-booked"
	key := framework.Key{Source: "appointments", ID: "a-1"}

	t.Run("CountIncrementsFromFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for want := 1; want <= 3; want++ {
			n, err := b.store.Count(ctx, consumer, key, 1)
			require.NoError(t, err)
			require.Equal(t, want, n)
		}
		other := framework.Key{Source: "appointments", ID: "a-2"}
		n, err := b.store.Count(ctx, consumer, other, 2)
		require.NoError(t, err)
		require.Equal(t, 2, n, "a new count starts at first")
		n, err = b.store.Count(ctx, consumer, other, 2)
		require.NoError(t, err)
		require.Equal(t, 3, n, "first only starts a new count")
		n, err = b.store.Count(ctx, "notifications.other", key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "counts are per consumer")
	})

	t.Run("ConcurrentCounts", func(t *testing.T) {
		// Counts asked for at once (a store may count them in one
		// statement): each distinct key counts from first, and the
		// counts of one key asked for at once are 1..n, each once.
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		const distinct, repeats = 40, 8
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			got     = make(map[string][]int)
			errs    []error
			hot     = framework.Key{Source: "appointments", ID: "hot"}
			countOf = func(k framework.Key, first int) {
				n, err := b.store.Count(ctx, consumer, k, first)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				got[k.ID] = append(got[k.ID], n)
			}
		)
		for i := range distinct {
			wg.Go(func() { countOf(framework.Key{Source: "appointments", ID: fmt.Sprintf("c-%d", i)}, 1+i%2) })
		}
		for range repeats {
			wg.Go(func() { countOf(hot, 1) })
		}
		wg.Wait()
		require.Empty(t, errs)
		for i := range distinct {
			require.Equal(t, []int{1 + i%2}, got[fmt.Sprintf("c-%d", i)])
		}
		hotCounts := got["hot"]
		slices.Sort(hotCounts)
		require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7, 8}, hotCounts)
	})

	t.Run("CountOddText", func(t *testing.T) {
		// Keys and consumers of text that JSON escapes count as they
		// are, one at a time and at once.
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		keys := []framework.Key{
			{Source: `src "quoted" \ back`, ID: "ctl\x01\t\n line\u2028 <&> \U0001F600"},
			{Source: "appointments", ID: strings.Repeat("long-", 50)},
			{Source: "appointments", ID: "a-1"},
		}
		for _, k := range keys {
			n, err := b.store.Count(ctx, `consumer "odd"`, k, 1)
			require.NoError(t, err)
			require.Equal(t, 1, n, "%q", k)
		}
		var wg sync.WaitGroup
		counts := make([]int, len(keys))
		errs := make([]error, len(keys))
		for i, k := range keys {
			wg.Go(func() { counts[i], errs[i] = b.store.Count(ctx, `consumer "odd"`, k, 1) })
		}
		wg.Wait()
		require.Equal(t, make([]error, len(keys)), errs)
		require.Equal(t, []int{2, 2, 2}, counts)
	})

	// A first delivery that the service hands back unhandled (a stop, a
	// rebalance) is recorded with first 0: its redelivery, which the
	// transport flags, counts as the first, and a count already there
	// stays as it is.
	t.Run("CountZeroRecordsUnhandled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		back := framework.Key{Source: "appointments", ID: "back-1"}
		for range 2 { // handed back twice, by two processes
			n, err := b.store.Count(ctx, consumer, back, 0)
			require.NoError(t, err)
			require.Equal(t, 0, n, "nothing counted")
		}
		n, err := b.store.Count(ctx, consumer, back, 2)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the redelivery of a message handed back unhandled counts as the first")

		counted := framework.Key{Source: "appointments", ID: "back-2"}
		_, err = b.store.Count(ctx, consumer, counted, 2)
		require.NoError(t, err)
		n, err = b.store.Count(ctx, consumer, counted, 0)
		require.NoError(t, err)
		require.Equal(t, 2, n, "a count stays as it is")
		n, err = b.store.Count(ctx, consumer, counted, 1)
		require.NoError(t, err)
		require.Equal(t, 3, n)

		// Asked for at once, in one statement where the store groups
		// them: each call gets its own semantics.
		var wg sync.WaitGroup
		keys := []framework.Key{{Source: "appointments", ID: "back-3"}, {Source: "appointments", ID: "back-4"}}
		got := make([]int, len(keys))
		errs := make([]error, len(keys))
		for i, k := range keys {
			wg.Go(func() { got[i], errs[i] = b.store.Count(ctx, consumer, k, i) })
		}
		wg.Wait()
		require.Equal(t, make([]error, len(keys)), errs)
		require.Equal(t, []int{0, 1}, got)
	})

	// A delivery that the service's stop ended, after an attempt ran to
	// its end, is taken back: it does not count towards the limit.
	t.Run("Uncount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for range 3 {
			_, err := b.store.Count(ctx, consumer, key, 1)
			require.NoError(t, err)
		}
		require.NoError(t, b.store.Uncount(ctx, consumer, key))
		n, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 3, n, "the uncounted delivery was taken back")

		first := framework.Key{Source: "appointments", ID: "a-2"}
		require.NoError(t, b.store.Uncount(ctx, consumer, first))
		n, err = b.store.Count(ctx, consumer, first, 2)
		require.NoError(t, err)
		require.Equal(t, 1, n, "an uncounted first delivery makes its redelivery the first counted")

		zero := framework.Key{Source: "appointments", ID: "a-3"}
		require.NoError(t, b.store.Uncount(ctx, consumer, zero))
		require.NoError(t, b.store.Uncount(ctx, consumer, zero))
		n, err = b.store.Count(ctx, consumer, zero, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "a count never goes below zero")

		n, err = b.store.Count(ctx, "notifications.other", key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "counts are per consumer")
	})

	t.Run("ForgetOnCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		_, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		n, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 2, n)

		out, err := b.doDelivery(ctx, b.uow, consumer, key, driver.Delivery{Counted: true}, func(ctx context.Context) error { return nil })
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)

		n, err = b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the committed attempt forgot the count")
	})

	// A dead-lettered message is acknowledged; when an operator replays
	// it, its deliveries are counted afresh, else a message dead-lettered
	// for its delivery limit would be dead-lettered again at once.
	t.Run("DeadLetterForgetsCount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for range 3 {
			_, err := b.store.Count(ctx, consumer, key, 1)
			require.NoError(t, err)
		}
		other := framework.Key{Source: "appointments", ID: "a-2"}
		_, err := b.store.Count(ctx, consumer, other, 1)
		require.NoError(t, err)

		dl := deadLetter(consumer, key.ID)
		dl.Source, dl.Code = key.Source, framework.CodeDeliveryLimit
		require.NoError(t, b.store.PublishDeadLetter(ctx, dl))

		n, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the dead letter took the count with it")
		n, err = b.store.Count(ctx, consumer, other, 1)
		require.NoError(t, err)
		require.Equal(t, 2, n, "other counts stay")
	})

	t.Run("RollbackKeepsCount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		_, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)

		// A failing handler rolls back before the count is forgotten.
		out, err := b.doDelivery(ctx, b.uow, consumer, key, driver.Delivery{Counted: true}, func(ctx context.Context) error { return errBoom })
		require.ErrorIs(t, err, errBoom)
		require.Equal(t, framework.Failed, out)
		n, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 2, n)

		if b.h.DB == nil {
			return // without a database nothing can fail after Forget
		}
		// An ack in the transaction fails after Forget ran in it.
		errAck := errors.New("ack")
		failing := driver.Delivery{Counted: true, Ack: driver.TxAck{DB: b.h.DB.DB, Batch: failingAck{errAck}}}
		out, err = b.doDelivery(ctx, b.uow, consumer, key, failing, func(ctx context.Context) error { return nil })
		require.ErrorIs(t, err, errAck)
		require.Equal(t, framework.Failed, out)
		n, err = b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 3, n, "the rolled-back Forget kept the count")
	})
}

// failingAck is a transport's ack inside the transaction that fails with
// err.
type failingAck struct{ err error }

func (f failingAck) AckInTx(context.Context, *driver.Tx, []any) error { return f.err }
