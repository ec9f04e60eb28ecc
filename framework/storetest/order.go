package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// txConsumer is the consumer of the attempts that inTx runs.
const txConsumer = "storetest.tx"

// inTx runs fn in an attempt of its own (a fresh event of txConsumer),
// with the attempt's transaction, and returns nil when it committed.
func (b *bundle) inTx(ctx context.Context, fn func(ctx context.Context, tx *framework.Tx) error) error {
	key := framework.Key{Source: "storetest", ID: strconv.FormatInt(b.attempts.Add(1), 10)}
	out, err := b.do(ctx, b.uow, txConsumer, key, func(ctx context.Context) error {
		tx, ok := pipeline.From[*framework.Tx](ctx)
		if !ok {
			return errors.New("no attempt transaction in the context")
		}
		return fn(ctx, tx)
	})
	if err == nil && out != framework.Processed {
		err = fmt.Errorf("attempt: outcome %s", out)
	}
	return err
}

// checkpoint reads the committed checkpoint of (consumer, subject) in an
// attempt of its own.
func (b *bundle) checkpoint(t *testing.T, consumer, subject string) int64 {
	t.Helper()
	var seq int64
	require.NoError(t, b.inTx(context.Background(), func(ctx context.Context, tx *framework.Tx) error {
		var err error
		seq, err = b.store.Checkpoint(ctx, tx, consumer, subject)
		return err
	}))
	return seq
}

// advance moves the checkpoint of (consumer, subject) to seq in an
// attempt of its own that commits, and returns whether it moved.
func (b *bundle) advance(t *testing.T, consumer, subject string, seq int64) bool {
	t.Helper()
	var moved bool
	require.NoError(t, b.inTx(context.Background(), func(ctx context.Context, tx *framework.Tx) error {
		var err error
		moved, err = b.store.Advance(ctx, tx, consumer, subject, seq)
		return err
	}))
	return moved
}

// holdSubject starts an attempt that reads the checkpoint of (consumer,
// subject) when read is true, as strict order does, advances it to seq and
// holds the subject until release is closed; then it commits. It returns
// once the subject is held.
func holdSubject(t *testing.T, b *bundle, consumer, subject string, read bool, seq int64, release <-chan struct{}) <-chan error {
	t.Helper()
	held := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- b.inTx(context.Background(), func(ctx context.Context, tx *framework.Tx) error {
			if read {
				if _, err := b.store.Checkpoint(ctx, tx, consumer, subject); err != nil {
					return err
				}
			}
			moved, err := b.store.Advance(ctx, tx, consumer, subject, seq)
			if err != nil {
				return err
			}
			if !moved {
				return fmt.Errorf("holder: the checkpoint did not move to %d", seq)
			}
			close(held)
			<-release
			return nil
		})
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("the holder ended before it held the subject: %v", err)
	}
	return done
}

// subjectResult is what a second attempt on a held subject saw.
type subjectResult struct {
	seq   int64 // the checkpoint it read
	moved bool  // whether its Advance moved the checkpoint
	err   error
}

// requireStillWaiting fails when the second attempt ended while the
// first held the subject. A store that makes it wait never fails here,
// however slow the machine; the pause only gives a store that does not
// wait the time to show it.
func requireStillWaiting(t *testing.T, second <-chan subjectResult) {
	t.Helper()
	select {
	case r := <-second:
		t.Fatalf("the second attempt did not wait for the first to end: read %d, moved %t, %v", r.seq, r.moved, r.err)
	case <-time.After(200 * time.Millisecond):
	}
}

func exerciseCheckpoints(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "shipping.pack-on-order-paid"

	t.Run("AdvanceMovesOnlyForward", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		require.Zero(t, b.checkpoint(t, consumer, "order-1"), "no checkpoint yet")
		require.NoError(t, b.inTx(context.Background(), func(ctx context.Context, tx *framework.Tx) error {
			for _, step := range []struct {
				seq  int64
				want bool
			}{{3, true}, {3, false}, {2, false}, {5, true}, {4, false}} {
				moved, err := b.store.Advance(ctx, tx, consumer, "order-1", step.seq)
				require.NoError(t, err)
				require.Equal(t, step.want, moved, "advance to %d", step.seq)
			}
			seq, err := b.store.Checkpoint(ctx, tx, consumer, "order-1")
			require.NoError(t, err)
			require.EqualValues(t, 5, seq, "the attempt sees its own advance")
			return nil
		}))
		require.EqualValues(t, 5, b.checkpoint(t, consumer, "order-1"))
		require.False(t, b.advance(t, consumer, "order-1", 5))
		require.True(t, b.advance(t, consumer, "order-1", 6))
		require.EqualValues(t, 6, b.checkpoint(t, consumer, "order-1"))
		require.Zero(t, b.checkpoint(t, consumer, "order-2"), "checkpoints are per subject")
		require.Zero(t, b.checkpoint(t, "shipping.other", "order-1"), "checkpoints are per consumer")
	})

	t.Run("AdvanceRollsBackWithTheAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		require.True(t, b.advance(t, consumer, "order-1", 2))
		err := b.inTx(context.Background(), func(ctx context.Context, tx *framework.Tx) error {
			for _, seq := range []int64{4, 6} {
				moved, err := b.store.Advance(ctx, tx, consumer, "order-1", seq)
				require.NoError(t, err)
				require.True(t, moved)
			}
			return errBoom
		})
		require.ErrorIs(t, err, errBoom)
		require.EqualValues(t, 2, b.checkpoint(t, consumer, "order-1"), "both advances rolled back")
		require.True(t, b.advance(t, consumer, "order-1", 3), "the rolled-back advances do not count")
		require.EqualValues(t, 3, b.checkpoint(t, consumer, "order-1"))
	})

	// Strict order: the second attempt on a subject reads the checkpoint
	// only once the first ended, so it reads what the first committed.
	t.Run("CheckpointMakesTheNextAttemptWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		release := make(chan struct{})
		holder := holdSubject(t, b, consumer, "order-1", true, 1, release)
		second := make(chan subjectResult, 1)
		go func() {
			var r subjectResult
			r.err = b.inTx(context.Background(), func(ctx context.Context, tx *framework.Tx) error {
				var err error
				r.seq, err = b.store.Checkpoint(ctx, tx, consumer, "order-1")
				return err
			})
			second <- r
		}()
		requireStillWaiting(t, second)

		close(release)
		require.NoError(t, <-holder)
		r := <-second
		require.NoError(t, r.err)
		require.EqualValues(t, 1, r.seq, "the second attempt read what the first committed")
	})

	// Skip stale: two attempts advance a subject to the same sequence;
	// the second waits for the first and finds it stale.
	t.Run("ConcurrentAdvanceMovesOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		release := make(chan struct{})
		holder := holdSubject(t, b, consumer, "order-1", false, 1, release)
		second := make(chan subjectResult, 1)
		go func() {
			var r subjectResult
			r.err = b.inTx(context.Background(), func(ctx context.Context, tx *framework.Tx) error {
				var err error
				r.moved, err = b.store.Advance(ctx, tx, consumer, "order-1", 1)
				return err
			})
			second <- r
		}()
		requireStillWaiting(t, second)

		close(release)
		require.NoError(t, <-holder)
		r := <-second
		require.NoError(t, r.err)
		require.False(t, r.moved, "the first attempt had moved it")
		require.EqualValues(t, 1, b.checkpoint(t, consumer, "order-1"))
	})
}

func exerciseWaits(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "shipping.pack-on-order-paid"
	key := framework.Key{Source: "orders", ID: "o-3"}
	body := []byte(`{"id":"o-3"}`)

	t.Run("WaitGapMeasuresByTheStoresClock", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		waited, err := b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
		require.NoError(t, err)
		require.Zero(t, waited, "the first wait starts now")

		b.clock.Advance(90 * time.Second)
		waited, err = b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
		require.NoError(t, err)
		require.Equal(t, 90*time.Second, waited)

		other := framework.Key{Source: "orders", ID: "o-4"}
		waited, err = b.store.WaitGap(ctx, consumer, "order-1", 4, other, body)
		require.NoError(t, err)
		require.Zero(t, waited, "waits are per sequence")
		waited, err = b.store.WaitGap(ctx, consumer, "order-2", 3, key, body)
		require.NoError(t, err)
		require.Zero(t, waited, "waits are per subject")
		waited, err = b.store.WaitGap(ctx, "shipping.other", "order-1", 3, key, body)
		require.NoError(t, err)
		require.Zero(t, waited, "waits are per consumer")
	})

	// A wait is an outcome, not a lost delivery: an event that waits long
	// behind a gap is not dead-lettered for its delivery limit.
	t.Run("WaitGapForgetsTheDeliveryCount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		other := framework.Key{Source: "orders", ID: "o-4"}
		for range 2 {
			_, err := b.store.Count(ctx, consumer, key, 1)
			require.NoError(t, err)
		}
		_, err := b.store.Count(ctx, consumer, other, 1)
		require.NoError(t, err)

		_, err = b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
		require.NoError(t, err)
		n, err := b.store.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the wait forgot the count")
		n, err = b.store.Count(ctx, consumer, other, 1)
		require.NoError(t, err)
		require.Equal(t, 2, n, "other counts stay")
	})

	// A copy of the event that takes effect while another copy, which
	// found it waiting, is about to record its wait: the wait must not
	// outlive the effect, which no later delivery (a duplicate) ends.
	t.Run("WaitGapAfterTheEffectRecordsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 1))
		release := make(chan struct{})
		holder := holdSubject(t, b, consumer, "order-1", true, 3, release)
		result := make(chan subjectResult, 1)
		go func() {
			_, err := b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
			result <- subjectResult{err: err}
		}()
		requireStillWaiting(t, result)
		close(release)
		require.NoError(t, <-holder)
		require.NoError(t, (<-result).err)

		b.clock.Advance(time.Minute)
		waited, err := b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
		require.NoError(t, err)
		require.Zero(t, waited, "no wait was recorded")
		waited, err = b.store.WaitGap(ctx, consumer, "order-1", 2, key, body)
		require.NoError(t, err)
		require.Zero(t, waited, "nor for an earlier sequence")
		parked, err := b.store.ParkGap(ctx, framework.ParkedEvent{Consumer: consumer, Subject: "order-1", Seq: 3, Key: key, Body: body})
		require.NoError(t, err)
		require.False(t, parked)
		ps, err := b.store.Parked(ctx, framework.ParkedFilter{})
		require.NoError(t, err)
		require.Empty(t, ps)
	})

	t.Run("EndWaitWithoutTx", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		_, err := b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
		require.NoError(t, err)
		b.clock.Advance(time.Minute)
		_, err = b.store.EndWait(ctx, nil, consumer, "order-1", 3, key)
		require.NoError(t, err)
		_, err = b.store.EndWait(ctx, nil, consumer, "order-1", 3, key)
		require.NoError(t, err, "ending no wait is no error")

		b.clock.Advance(time.Minute)
		waited, err := b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
		require.NoError(t, err)
		require.Zero(t, waited, "the ended wait does not count")
	})

	t.Run("EndWaitInTx", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		_, err := b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
		require.NoError(t, err)
		endWait := func(ctx context.Context, tx *framework.Tx) error {
			_, err := b.store.EndWait(ctx, tx, consumer, "order-1", 3, key)
			return err
		}

		err = b.inTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
			require.NoError(t, endWait(ctx, tx))
			return errBoom
		})
		require.ErrorIs(t, err, errBoom)
		b.clock.Advance(time.Minute)
		waited, err := b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
		require.NoError(t, err)
		require.Equal(t, time.Minute, waited, "the rolled-back end kept the wait")

		require.NoError(t, b.inTx(ctx, endWait))
		b.clock.Advance(time.Minute)
		waited, err = b.store.WaitGap(ctx, consumer, "order-1", 3, key, body)
		require.NoError(t, err)
		require.Zero(t, waited, "the committed end removed the wait")
	})
}

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
		ps, err := b.store.Parked(ctx, framework.ParkedFilter{Consumer: from})
		require.NoError(t, err)
		require.Empty(t, ps, "the old name holds nothing")
		ps, err = b.store.Parked(ctx, framework.ParkedFilter{Consumer: consumer})
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
		parked := func(consumer string, seq int64, id string) framework.ParkedEvent {
			t.Helper()
			body, err := framework.Encode(framework.Envelope{
				Attributes: framework.Attributes{
					ID: id, Source: "orders", Type: "orders.order.paid", Version: 2,
					Subject: "s", SubjectSeq: seq, CorrelationID: "corr-" + id,
				},
				Data: []byte(`{"n":1}`),
			})
			require.NoError(t, err)
			return framework.ParkedEvent{
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
		for _, p := range []framework.ParkedEvent{lost, parked(from, 5, "old-5"), parked(from, 6, "old-6")} {
			require.True(t, b.park(t, p, false))
		}
		_, err := b.store.WaitGap(ctx, from, "s", 7, key("old-7"), []byte(`{}`))
		require.NoError(t, err)
		b.hold(t, from, "s", 8, key("old-8"))

		_, err = b.store.Adopt(ctx, consumer, from)
		require.NoError(t, err)
		ps, err := b.store.Parked(ctx, framework.ParkedFilter{Consumer: consumer})
		require.NoError(t, err)
		got := make(map[int64]framework.Key)
		for _, p := range ps {
			got[p.Seq] = p.Key
			require.Equal(t, p.Seq == 3 || p.Seq == 8, p.Held, p.Seq)
		}
		require.Equal(t, map[int64]framework.Key{
			3: key("new-3"), 4: key("new-4"), 5: key("old-5"), 6: key("old-6"), 7: key("new-7"), 8: key("old-8"),
		}, got, "the new name's places stay, but its waits, which the old name's parking and hold take")
		ps, err = b.store.Parked(ctx, framework.ParkedFilter{Consumer: from})
		require.NoError(t, err)
		require.Empty(t, ps)

		dls, err := b.store.DeadLetters(ctx, framework.DeadLetterFilter{Consumer: consumer, EventID: "old-4"})
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
		require.Equal(t, []framework.HistoryKind{framework.HistoryFailed, framework.HistoryAdopted}, kinds(h))
		require.Equal(t, framework.CodeSequenceConflict, h[0].Code)
		dls, err = b.store.DeadLetters(ctx, framework.DeadLetterFilter{Consumer: consumer, EventID: "old-3"})
		require.NoError(t, err)
		require.Len(t, dls, 1, "the old name's held dead letter is the new name's, holding nothing")

		_, err = b.store.Adopt(ctx, consumer, from)
		require.NoError(t, err)
		dls, err = b.store.DeadLetters(ctx, framework.DeadLetterFilter{Consumer: consumer})
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
		publish := func(consumer, id string) framework.DeadLetter {
			t.Helper()
			require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, id)))
			dls, err := b.store.DeadLetters(ctx, framework.DeadLetterFilter{Consumer: consumer, EventID: id})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			return dls[0]
		}
		alone := publish(from, "e-1")
		both := publish(from, "e-2")
		_, err := b.store.ResolveDeadLetter(ctx, both.ID, framework.Resolution{
			Status: framework.DeadLetterReplayed, By: "alice", Reason: "retry",
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

		old, err := b.store.DeadLetters(ctx, framework.DeadLetterFilter{Consumer: from})
		require.NoError(t, err)
		require.Empty(t, old, "the old name has no dead letter left")

		got, err := b.store.DeadLetter(ctx, alone.ID)
		require.NoError(t, err)
		require.Equal(t, consumer, got.Consumer, "the dead letter keeps its id under the new name")
		h := history(t, b.store, alone.ID)
		require.Equal(t, []framework.HistoryKind{framework.HistoryFailed, framework.HistoryAdopted}, kinds(h))
		require.Equal(t, from, h[1].By, "the adoption names the old name")
		requireTime(t, adoptedAt, h[1].At, "the adoption's time")

		_, err = b.store.DeadLetter(ctx, both.ID)
		require.ErrorIs(t, err, framework.ErrNotFound, "the old name's dead letter of an event the new name has one of is merged")
		got, err = b.store.DeadLetter(ctx, kept.ID)
		require.NoError(t, err)
		require.Equal(t, framework.DeadLetterPending, got.Status, "the new name's dead letter is kept as it was")
		require.Equal(t, 1, got.Repeats, "with the other's failure")
		requireTime(t, t0, got.FirstFailedAt, "and its first failure")
		h = history(t, b.store, kept.ID)
		require.Equal(t, []framework.HistoryKind{
			framework.HistoryFailed, framework.HistoryReplayed, framework.HistoryFailed, framework.HistoryAdopted,
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
