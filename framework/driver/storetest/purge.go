package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

func exercisePurge(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "billing.charge-on-order-placed"

	// outcome runs a handler that does nothing for key and returns the
	// unit of work's outcome: Duplicate while the mark is there.
	outcome := func(t *testing.T, b *bundle, key framework.Key) framework.Outcome {
		t.Helper()
		out, err := b.do(context.Background(), b.uow, consumer, key, func(context.Context) error { return nil })
		require.NoError(t, err)
		return out
	}

	t.Run("PurgeOldestFirstBeforeTheTime", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		keys := []framework.Key{{Source: "orders", ID: "1"}, {Source: "orders", ID: "2"}, {Source: "orders", ID: "3"}}
		var at []time.Time
		for _, k := range keys {
			at = append(at, b.clock.Now())
			require.Equal(t, framework.Processed, outcome(t, b, k))
			b.clock.Advance(time.Minute)
		}

		n, err := b.store.PurgeProcessed(ctx, at[0], 10)
		require.NoError(t, err)
		require.Zero(t, n, "a mark processed at before is kept")
		n, err = b.store.PurgeProcessed(ctx, at[2].Add(time.Hour), 0)
		require.NoError(t, err)
		require.Zero(t, n, "a limit of 0 purges none")

		n, err = b.store.PurgeProcessed(ctx, at[2], 1)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "up to limit")
		require.Equal(t, framework.Duplicate, outcome(t, b, keys[1]))
		require.Equal(t, framework.Duplicate, outcome(t, b, keys[2]))

		n, err = b.store.PurgeProcessed(ctx, at[2], 10)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the second mark; the third is not older than before")
		require.Equal(t, framework.Duplicate, outcome(t, b, keys[2]))
		n, err = b.store.PurgeProcessed(ctx, at[2], 10)
		require.NoError(t, err)
		require.Zero(t, n)

		// An event that comes back after its mark went is processed again.
		require.Equal(t, framework.Processed, outcome(t, b, keys[0]))
		require.Equal(t, framework.Processed, outcome(t, b, keys[1]))
	})
}
