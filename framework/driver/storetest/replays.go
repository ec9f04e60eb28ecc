package storetest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// replayOf returns a replay of event id to consumer.
func replayOf(consumer, id string) driver.Replay {
	return driver.Replay{
		Consumer: consumer,
		Topic:    "appointments.appointment.booked",
		Body:     []byte(`{"specversion":"1.0","id":"` + id + `"}`),
		Metadata: map[string]string{"content-type": framework.ContentType},
	}
}

// replayIDs returns the ids of rs.
func replayIDs(rs []driver.Replay) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func exerciseReplays(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "notifications.remind-on-appointment-booked"

	t.Run("ClaimLeasesOldestFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.NoError(t, b.store.AddReplays(ctx, []driver.Replay{
			replayOf(consumer, "e-1"), replayOf(consumer, "e-2"), replayOf("other", "e-3"),
		}))
		first, err := b.store.ClaimReplays(ctx, 2, time.Minute)
		require.NoError(t, err)
		require.Len(t, first, 2)
		require.Less(t, first[0].ID, first[1].ID, "oldest first")
		want := replayOf(consumer, "e-1")
		want.ID, want.CreatedAt = first[0].ID, first[0].CreatedAt
		require.Equal(t, want, first[0])
		requireTime(t, t0, first[0].CreatedAt, "CreatedAt is the store's time")
		require.Zero(t, first[0].DeadLetterID, "a replay of its own, not of a dead letter")

		rest, err := b.store.ClaimReplays(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, rest, 1, "the leased ones are not claimed again")
		require.Equal(t, "other", rest[0].Consumer)
		none, err := b.store.ClaimReplays(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, none)

		require.NoError(t, b.store.ReplaySent(ctx, first[0].ID))
		require.NoError(t, b.store.ReplaySent(ctx, first[0].ID), "sent twice is sent")
		b.clock.Advance(time.Minute + time.Second)
		again, err := b.store.ClaimReplays(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []int64{first[1].ID, rest[0].ID}, replayIDs(again),
			"once the lease ends, the replays not sent are claimed again; the sent one is not")

		err = b.store.ReplaySent(ctx, rest[0].ID+1000)
		require.ErrorIs(t, err, driver.ErrNotFound)
		_, err = b.store.ClaimReplays(ctx, 0, time.Minute)
		require.Error(t, err)
		_, err = b.store.ClaimReplays(ctx, 1, 0)
		require.Error(t, err)
	})

	// A claim holds no more bodies than fit in ReplayClaimBytes together,
	// and the first one whatever its size: dead letters keep their body.
	t.Run("ClaimHoldsAtMostReplayClaimBytes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		sized := func(id string, n int) driver.Replay {
			r := replayOf(consumer, id)
			r.Body = bytes.Repeat([]byte{'x'}, n)
			return r
		}
		third := driver.ReplayClaimBytes / 3
		require.NoError(t, b.store.AddReplays(ctx, []driver.Replay{
			sized("e-1", third+1), sized("e-2", third+1), sized("e-3", third+1),
			sized("e-4", driver.ReplayClaimBytes+1), sized("e-5", 10),
		}))
		var got [][]int
		for range 4 {
			rs, err := b.store.ClaimReplays(ctx, 10, time.Minute)
			require.NoError(t, err)
			var sizes []int
			for _, r := range rs {
				sizes = append(sizes, len(r.Body))
			}
			got = append(got, sizes)
		}
		require.Equal(t, [][]int{
			{third + 1, third + 1},
			{third + 1},
			{driver.ReplayClaimBytes + 1},
			{10},
		}, got, "two thirds and a bit fit, three do not; a body over the budget is claimed alone")
	})

	t.Run("AddIsAllOrNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.Error(t, b.store.AddReplays(ctx, []driver.Replay{replayOf(consumer, "e-1"), replayOf("", "e-2")}))
		rs, err := b.store.ClaimReplays(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, rs)
		require.NoError(t, b.store.AddReplays(ctx, nil))
	})

	// Each replay is a row of its own: the same event added twice is
	// replayed twice (the consumer's processed mark absorbs the second).
	t.Run("SameEventTwice", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.NoError(t, b.store.AddReplays(ctx, []driver.Replay{replayOf(consumer, "e-1")}))
		require.NoError(t, b.store.AddReplays(ctx, []driver.Replay{replayOf(consumer, "e-1")}))
		rs, err := b.store.ClaimReplays(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, rs, 2)
	})

	// Relays that claim at once never take the same replay.
	t.Run("ConcurrentClaimsTakeEachOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		const replays, relays = 30, 6
		var rs []driver.Replay
		for i := range replays {
			rs = append(rs, replayOf(consumer, fmt.Sprintf("e-%d", i)))
		}
		require.NoError(t, b.store.AddReplays(ctx, rs))
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			claimed []int64
			errs    []error
			start   = make(chan struct{})
		)
		for range relays {
			wg.Go(func() {
				<-start
				got, err := b.store.ClaimReplays(ctx, 4, time.Minute)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				claimed = append(claimed, replayIDs(got)...)
			})
		}
		close(start)
		wg.Wait()
		require.Empty(t, errs)
		for {
			got, err := b.store.ClaimReplays(ctx, 4, time.Minute)
			require.NoError(t, err)
			if len(got) == 0 {
				break
			}
			claimed = append(claimed, replayIDs(got)...)
		}
		require.Len(t, claimed, replays, "each replay claimed once")
		slices.Sort(claimed)
		require.Len(t, slices.Compact(claimed), replays, "no replay claimed twice")
	})
}
