package storetest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

func exerciseAdopt(t *testing.T, newHarness func(t *testing.T) Harness) {
	const (
		from     = "billing.charge"
		consumer = "billing.charge-on-order-placed"
	)
	nop := func(context.Context) error { return nil }

	t.Run("AdoptCopiesMarksAndCheckpoints", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		k1, k2, k3 := framework.Key{Source: "orders", ID: "1"}, framework.Key{Source: "orders", ID: "2"}, framework.Key{Source: "orders", ID: "3"}
		for _, k := range []framework.Key{k1, k2} {
			out, err := b.do(ctx, b.uow, from, k, nop)
			require.NoError(t, err)
			require.Equal(t, framework.Processed, out)
		}
		b.clock.Advance(time.Hour)
		out, err := b.do(ctx, b.uow, consumer, k2, nop)
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out, "the new name processed k2 already")
		require.True(t, b.advance(t, from, "order-1", 5))
		require.True(t, b.advance(t, from, "order-2", 3))
		require.True(t, b.advance(t, consumer, "order-2", 7))

		n, err := b.store.Adopt(ctx, consumer, from)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "only k1 is new")
		out, err = b.do(ctx, b.uow, consumer, k1, func(context.Context) error { return errBoom })
		require.NoError(t, err)
		require.Equal(t, framework.Duplicate, out, "what the old name processed is processed for the new one")
		require.EqualValues(t, 5, b.checkpoint(t, consumer, "order-1"))
		require.EqualValues(t, 7, b.checkpoint(t, consumer, "order-2"), "the higher checkpoint stays")
		require.EqualValues(t, 5, b.checkpoint(t, from, "order-1"), "the old name keeps its own")

		n, err = b.store.Adopt(ctx, consumer, from)
		require.NoError(t, err)
		require.Zero(t, n, "running it again adopts nothing new")

		out, err = b.do(ctx, b.uow, from, k3, nop)
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)
		require.True(t, b.advance(t, from, "order-1", 9))
		n, err = b.store.Adopt(ctx, consumer, from)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "what is new since")
		require.EqualValues(t, 9, b.checkpoint(t, consumer, "order-1"))

		// An adopted mark keeps the time it was processed at: the purge
		// takes it with the old name's marks of that time.
		n, err = b.store.PurgeProcessed(ctx, t0.Add(time.Minute), 100)
		require.NoError(t, err)
		require.EqualValues(t, 3, n, "k1 and k2 of the old name, k1 adopted")
	})

	// The new name takes the old one's held and parked events and its
	// waits behind a gap, so that a rename under strict order neither
	// loses the events parked behind a dead letter nor releases them.
	t.Run("AdoptMovesParkedEvents", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		held := framework.Key{Source: "orders", ID: "held"}
		b.hold(t, from, "s", 2, held)
		_, err := b.store.WaitGap(ctx, from, "t", 5, framework.Key{Source: "orders", ID: "t5"}, []byte(`{}`))
		require.NoError(t, err)
		b.clock.Advance(time.Minute)

		_, err = b.store.Adopt(ctx, consumer, from)
		require.NoError(t, err)
		ps, err := b.store.Parked(ctx, driver.ParkedFilter{Consumer: from})
		require.NoError(t, err)
		require.Empty(t, ps, "the old name holds nothing")
		ps, err = b.store.Parked(ctx, driver.ParkedFilter{Consumer: consumer})
		require.NoError(t, err)
		require.Len(t, ps, 1)
		require.True(t, ps[0].Held)
		require.Equal(t, held, ps[0].Key)
		require.EqualValues(t, 2, ps[0].Seq)
		waited, err := b.store.WaitGap(ctx, consumer, "t", 5, framework.Key{Source: "orders", ID: "t5"}, []byte(`{}`))
		require.NoError(t, err)
		require.GreaterOrEqual(t, waited, time.Minute, "the wait keeps its start under the new name")
	})

	// Where both names have a place at one sequence of a subject, the
	// old name's parked event, the only copy of an acknowledged message,
	// is never dropped: it takes the place of the new name's wait, and
	// where the new name's place is another event's parking, hold or
	// skip, it becomes a dead letter of the new name (sequence_conflict,
	// holding nothing), as a second event of one step is.
	t.Run("AdoptNeverDropsAParkedEvent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		key := func(name string) framework.Key { return framework.Key{Source: "orders", ID: name} }
		parked := func(consumer string, seq int64, id string) driver.ParkedEvent {
			t.Helper()
			body, err := framework.Encode(framework.Envelope{
				Attributes: framework.Attributes{
					ID: id, Source: "orders", Type: "orders.order.paid", Version: 2,
					Subject: "s", SubjectSeq: seq, CorrelationID: "corr-" + id,
				},
				Data: []byte(`{"n":1}`),
			})
			require.NoError(t, err)
			return driver.ParkedEvent{
				Consumer: consumer, Subject: "s", Seq: seq, Key: key(id),
				Topic: "orders.order.paid", Body: body, Metadata: map[string]string{"traceparent": "t-" + id},
			}
		}
		// The new name: 3 held, 4 parked behind it, a wait at 5, 6 free,
		// 7 parked and a wait at 8.
		b.hold(t, consumer, "s", 3, key("new-3"))
		require.True(t, b.park(t, parked(consumer, 4, "new-4"), false))
		require.True(t, b.park(t, parked(consumer, 7, "new-7"), false))
		for _, seq := range []int64{5, 8} {
			_, err := b.store.WaitGap(ctx, consumer, "s", seq, key(fmt.Sprintf("new-%d", seq)), []byte(`{}`))
			require.NoError(t, err)
		}
		// The old name: 3 held, another event parked at each of 4, 5 and
		// 6, a wait at 7 and 8 held.
		b.hold(t, from, "s", 3, key("old-3"))
		lost := parked(from, 4, "old-4")
		for _, p := range []driver.ParkedEvent{lost, parked(from, 5, "old-5"), parked(from, 6, "old-6")} {
			require.True(t, b.park(t, p, false))
		}
		_, err := b.store.WaitGap(ctx, from, "s", 7, key("old-7"), []byte(`{}`))
		require.NoError(t, err)
		b.hold(t, from, "s", 8, key("old-8"))

		_, err = b.store.Adopt(ctx, consumer, from)
		require.NoError(t, err)
		ps, err := b.store.Parked(ctx, driver.ParkedFilter{Consumer: consumer})
		require.NoError(t, err)
		got := make(map[int64]framework.Key)
		for _, p := range ps {
			got[p.Seq] = p.Key
			require.Equal(t, p.Seq == 3 || p.Seq == 8, p.Held, p.Seq)
		}
		require.Equal(t, map[int64]framework.Key{
			3: key("new-3"), 4: key("new-4"), 5: key("old-5"), 6: key("old-6"), 7: key("new-7"), 8: key("old-8"),
		}, got, "the new name's places stay, but its waits, which the old name's parking and hold take")
		ps, err = b.store.Parked(ctx, driver.ParkedFilter{Consumer: from})
		require.NoError(t, err)
		require.Empty(t, ps)

		dls, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: consumer, EventID: "old-4"})
		require.NoError(t, err)
		require.Len(t, dls, 1, "the old name's event parked in another's place is a dead letter")
		dl := dls[0]
		require.Equal(t, framework.CodeSequenceConflict, dl.Code)
		require.Equal(t, lost.Key, dl.Key())
		require.Equal(t, lost.Body, dl.Body, "with its message")
		require.Equal(t, lost.Topic, dl.Topic)
		require.Equal(t, "t-old-4", dl.Metadata["traceparent"])
		require.Equal(t, "s", dl.Subject)
		require.EqualValues(t, 4, dl.SubjectSeq)
		require.Equal(t, "orders.order.paid", dl.Type)
		require.Equal(t, 2, dl.Version)
		require.Equal(t, "corr-old-4", dl.CorrelationID)
		h := history(t, b.store, dl.ID)
		require.Equal(t, []driver.HistoryKind{driver.HistoryFailed, driver.HistoryAdopted}, kinds(h))
		require.Equal(t, framework.CodeSequenceConflict, h[0].Code)
		dls, err = b.store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: consumer, EventID: "old-3"})
		require.NoError(t, err)
		require.Len(t, dls, 1, "the old name's held dead letter is the new name's, holding nothing")

		_, err = b.store.Adopt(ctx, consumer, from)
		require.NoError(t, err)
		dls, err = b.store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: consumer})
		require.NoError(t, err)
		require.Len(t, dls, 4, "new-3, old-3, old-4 and old-8, once: running it again moves nothing")
	})

	// The new name takes the old one's dead letters (their history
	// records the adoption), its unsent replays and its delivery counts.
	// When both names have a dead letter of one event, the new name's is
	// kept and takes in the other's history.
	t.Run("AdoptMovesDeadLettersAndCounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		publish := func(consumer, id string) driver.DeadLetter {
			t.Helper()
			require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, id)))
			dls, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: consumer, EventID: id})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			return dls[0]
		}
		alone := publish(from, "e-1")
		both := publish(from, "e-2")
		_, err := b.store.ResolveDeadLetter(ctx, both.ID, driver.Resolution{
			Status: driver.DeadLetterReplayed, By: "alice", Reason: "retry",
		})
		require.NoError(t, err)
		b.clock.Advance(time.Hour)
		kept := publish(consumer, "e-2")

		k1, k2 := framework.Key{Source: "orders", ID: "1"}, framework.Key{Source: "orders", ID: "2"}
		count := func(consumer string, k framework.Key) int {
			t.Helper()
			n, err := b.store.Count(ctx, consumer, k, 1)
			require.NoError(t, err)
			return n
		}
		count(from, k1)
		count(from, k1)
		count(consumer, k1)
		count(from, k2)

		adoptedAt := b.clock.Advance(time.Minute)
		_, err = b.store.Adopt(ctx, consumer, from)
		require.NoError(t, err)
		adoptAgain := func() {
			t.Helper()
			_, err := b.store.Adopt(ctx, consumer, from)
			require.NoError(t, err)
		}
		adoptAgain() // nothing left to move

		old, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: from})
		require.NoError(t, err)
		require.Empty(t, old, "the old name has no dead letter left")

		got, err := b.store.DeadLetter(ctx, alone.ID)
		require.NoError(t, err)
		require.Equal(t, consumer, got.Consumer, "the dead letter keeps its id under the new name")
		h := history(t, b.store, alone.ID)
		require.Equal(t, []driver.HistoryKind{driver.HistoryFailed, driver.HistoryAdopted}, kinds(h))
		require.Equal(t, from, h[1].By, "the adoption names the old name")
		requireTime(t, adoptedAt, h[1].At, "the adoption's time")

		_, err = b.store.DeadLetter(ctx, both.ID)
		require.ErrorIs(t, err, driver.ErrNotFound, "the old name's dead letter of an event the new name has one of is merged")
		got, err = b.store.DeadLetter(ctx, kept.ID)
		require.NoError(t, err)
		require.Equal(t, driver.DeadLetterPending, got.Status, "the new name's dead letter is kept as it was")
		require.Equal(t, 1, got.Repeats, "with the other's failure")
		requireTime(t, t0, got.FirstFailedAt, "and its first failure")
		h = history(t, b.store, kept.ID)
		require.Equal(t, []driver.HistoryKind{
			driver.HistoryFailed, driver.HistoryReplayed, driver.HistoryFailed, driver.HistoryAdopted,
		}, kinds(h), "the merged history, in the order it was written")
		require.Equal(t, "alice", h[1].By)
		require.Equal(t, from, h[3].By)
		require.Contains(t, h[3].Reason, strconv.FormatInt(both.ID, 10), "the adoption says which dead letter it merged")

		rs, err := b.store.ClaimReplays(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, rs, 1)
		require.Equal(t, consumer, rs[0].Consumer, "the unsent replay goes to the new name")
		require.Equal(t, kept.ID, rs[0].DeadLetterID)

		require.Equal(t, 4, count(consumer, k1), "both names' deliveries of k1 add up")
		require.Equal(t, 2, count(consumer, k2))
		require.Equal(t, 1, count(from, k1), "the old name's counts moved")
	})
}
