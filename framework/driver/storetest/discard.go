package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// discardSettlesTheEvent shows that a discarded dead letter settles its
// event for its consumer: a copy that comes later (a redelivery, a
// producer's second publish) takes no mark, as a duplicate does not,
// whether it is marked alone or in a batch, and a store that peeks
// reports it processed. A pending or replayed dead letter does not: its
// event may still take effect (a replay is how it does). Another
// consumer's discard is its own.
func discardSettlesTheEvent(t *testing.T, newHarness func(t *testing.T) Harness, consumer string) {
	t.Parallel()
	b := setup(t, newHarness)
	ctx := context.Background()
	const other = "billing.charge-on-appointment-booked"
	resolved := map[string]driver.DeadLetterStatus{
		"e-0": driver.DeadLetterDiscarded, "e-1": driver.DeadLetterDiscarded,
		"e-2": driver.DeadLetterPending, "e-3": driver.DeadLetterReplayed,
	}
	for id, status := range resolved {
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, id)))
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(other, id)))
		if status == driver.DeadLetterPending {
			continue
		}
		dl := only(t, b.store, driver.DeadLetterFilter{Consumer: consumer, Source: "appointments", EventID: id})
		require.NoError(t, resolve(ctx, b.store, dl.ID, driver.Resolution{Status: status, By: "ops"}))
	}
	// The other consumer discards e-2, which stays pending here.
	dl := only(t, b.store, driver.DeadLetterFilter{Consumer: other, Source: "appointments", EventID: "e-2"})
	require.NoError(t, resolve(ctx, b.store, dl.ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops"}))

	// Sixteen events at once, so that batches form where the unit of
	// work gathers them: e-0 and e-1 discarded, the rest not.
	const n = 16
	outcomes := make([]framework.Outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			key := framework.Key{Source: "appointments", ID: fmt.Sprintf("e-%d", i)}
			out, err := b.do(ctx, b.uow, consumer, key, func(ctx context.Context) error {
				return b.effects.write(ctx, key.ID)
			})
			assert.NoError(t, err)
			outcomes[i] = out
		})
	}
	wg.Wait()
	for i, out := range outcomes {
		id := fmt.Sprintf("e-%d", i)
		if resolved[id] == driver.DeadLetterDiscarded {
			require.Equal(t, framework.Duplicate, out, "%s: discarded", id)
			require.Zero(t, b.effects.count(t, id), "%s: discarded, no effect", id)
			continue
		}
		require.Equal(t, framework.Processed, out, "%s", id)
		require.Equal(t, 1, b.effects.count(t, id), "%s", id)
	}
	out, err := b.do(ctx, b.uow, consumer, framework.Key{Source: "appointments", ID: "e-0"}, func(ctx context.Context) error {
		return b.effects.write(ctx, "e-0")
	})
	require.NoError(t, err)
	require.Equal(t, framework.Duplicate, out, "alone too")
	require.Zero(t, b.effects.count(t, "e-0"))
	out, err = b.do(ctx, b.uow, other, framework.Key{Source: "appointments", ID: "e-0"}, func(ctx context.Context) error {
		return b.effects.write(ctx, "other e-0")
	})
	require.NoError(t, err)
	require.Equal(t, framework.Processed, out, "the other consumer's dead letter is pending")

	if p, ok := b.store.(driver.Peeker); ok {
		for id, want := range map[string]bool{"e-0": true, "e-2": true, "e-3": true, "e-9": true, "e-1": true} {
			processed, _, err := p.Peek(ctx, consumer, framework.Key{Source: "appointments", ID: id}, "")
			require.NoError(t, err)
			require.Equal(t, want, processed, "%s: processed, or discarded", id)
		}
		processed, _, err := p.Peek(ctx, other, framework.Key{Source: "appointments", ID: "e-1"}, "")
		require.NoError(t, err)
		require.False(t, processed, "the other consumer's e-1 is pending and unprocessed")
		processed, _, err = p.Peek(ctx, other, framework.Key{Source: "appointments", ID: "e-2"}, "")
		require.NoError(t, err)
		require.True(t, processed, "the other consumer discarded e-2")
	}
	got := only(t, b.store, driver.DeadLetterFilter{Consumer: consumer, Source: "appointments", EventID: "e-0"})
	require.Equal(t, driver.DeadLetterDiscarded, got.Status, "a copy changes nothing of the dead letter")
	require.Zero(t, got.Repeats)
}
