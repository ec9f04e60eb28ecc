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
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// txConsumer is the consumer of the attempts that inTx runs.
const txConsumer = "storetest.tx"

// inTx runs fn in an attempt of its own (a fresh event of txConsumer),
// with the attempt's transaction, and returns nil when it committed.
func (b *bundle) inTx(ctx context.Context, fn func(ctx context.Context, tx *driver.Tx) error) error {
	key := framework.Key{Source: "storetest", ID: strconv.FormatInt(b.attempts.Add(1), 10)}
	out, err := b.do(ctx, b.uow, txConsumer, key, func(ctx context.Context) error {
		tx, ok := pipeline.From[*driver.Tx](ctx)
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
	require.NoError(t, b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
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
	require.NoError(t, b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
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
		done <- b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
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
		require.NoError(t, b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
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
		err := b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
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
			r.err = b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
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
			r.err = b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
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
		n, err := b.store.Count(ctx, consumer, key, 2)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the wait forgot the count: the redelivery, flagged, counts as the first")
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
		parked, err := b.store.ParkGap(ctx, driver.ParkedEvent{Consumer: consumer, Subject: "order-1", Seq: 3, Key: key, Body: body})
		require.NoError(t, err)
		require.False(t, parked)
		ps, err := b.store.Parked(ctx, driver.ParkedFilter{})
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
		endWait := func(ctx context.Context, tx *driver.Tx) error {
			_, err := b.store.EndWait(ctx, tx, consumer, "order-1", 3, key)
			return err
		}

		err = b.inTx(ctx, func(ctx context.Context, tx *driver.Tx) error {
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
