package storetest

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// hold stores the dead letter of the event key, with sequence seq of
// subject, for consumer, holding its subject (HoldDeadLetter).
func (b *bundle) hold(t *testing.T, consumer, subject string, seq int64, key framework.Key) {
	t.Helper()
	dl := eventDeadLetter(consumer, subject, seq, key, framework.CodeHandlerFailed)
	require.NoError(t, b.store.HoldDeadLetter(context.Background(), dl))
}

// eventDeadLetter is the dead letter with code of the event key, with
// sequence seq of subject, for consumer.
func eventDeadLetter(consumer, subject string, seq int64, key framework.Key, code framework.Code) driver.DeadLetter {
	dl := deadLetter(consumer, key.ID)
	dl.Source, dl.Subject, dl.SubjectSeq, dl.Code = key.Source, subject, seq, code
	return dl
}

// attemptPark runs an attempt of consumer on p's event that reads the
// subject's checkpoint, as strict order does, and parks p; the attempt
// commits unless Park failed, or rollback: then it ends with errBoom. It
// returns whether Park parked p, and the attempt's outcome and error.
func (b *bundle) attemptPark(p driver.ParkedEvent, rollback bool) (bool, framework.Outcome, error) {
	var parked bool
	out, err := b.do(context.Background(), b.uow, p.Consumer, p.Key, func(ctx context.Context) error {
		tx, _ := pipeline.From[*driver.Tx](ctx)
		if _, err := b.store.Checkpoint(ctx, tx, p.Consumer, p.Subject); err != nil {
			return err
		}
		var err error
		if parked, err = b.store.Park(ctx, tx, p); err != nil {
			return err
		}
		if rollback {
			return errBoom
		}
		return nil
	})
	return parked, out, err
}

// park is attemptPark, whose attempt commits when it parked p and ends
// with errBoom when rollback. It returns whether Park parked p.
func (b *bundle) park(t *testing.T, p driver.ParkedEvent, rollback bool) bool {
	t.Helper()
	parked, out, err := b.attemptPark(p, rollback)
	if rollback {
		require.ErrorIs(t, err, errBoom)
		return parked
	}
	require.NoError(t, err)
	require.Equal(t, framework.Processed, out)
	return parked
}

// endWait runs EndWait of (consumer, subject, seq) for the event key in
// an attempt that commits, and returns what it reported.
func (b *bundle) endWait(t *testing.T, consumer, subject string, seq int64, key framework.Key) bool {
	t.Helper()
	var after bool
	require.NoError(t, b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
		var err error
		after, err = b.store.EndWait(ctx, tx, consumer, subject, seq, key)
		return err
	}))
	return after
}

// seqs returns the sequences of ps, each with H when held and R when
// ready.
func seqs(ps []driver.ParkedEvent) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		s := p.Subject + "#" + string(rune('0'+p.Seq))
		if p.Held {
			s += "H"
		}
		if p.Ready {
			s += "R"
		}
		out = append(out, s)
	}
	return out
}

func exerciseParked(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "shipping.pack-on-order-paid"
	event := func(seq int64) driver.ParkedEvent {
		id := string(rune('0' + seq))
		return driver.ParkedEvent{
			Consumer: consumer, Subject: "order-1", Seq: seq,
			Key:      framework.Key{Source: "orders", ID: "e" + id},
			Topic:    "orders.order.paid",
			Body:     []byte(`{"n":` + id + `}`),
			Metadata: map[string]string{"traceparent": "t" + id},
		}
	}
	// rival is another event than event(seq) with its sequence: two
	// events claimed one step.
	rival := func(seq int64) driver.ParkedEvent {
		p := event(seq)
		p.Key.ID += "-other"
		p.Body = []byte(`{"other":true}`)
		return p
	}
	// places puts each kind of place in the sequence of order-1, past
	// its checkpoint at 2: 3 held, 4 parked behind it, 5 held, a skip at
	// 6 (discarded before its turn) and a wait at 7.
	places := func(t *testing.T, b *bundle) {
		t.Helper()
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 2))
		b.hold(t, consumer, "order-1", 3, event(3).Key)
		require.True(t, b.park(t, event(4), false))
		b.hold(t, consumer, "order-1", 5, event(5).Key)
		b.hold(t, consumer, "order-1", 6, event(6).Key)
		_, err := b.store.Skip(ctx, consumer, "order-1", event(6).Key)
		require.NoError(t, err)
		_, err = b.store.WaitGap(ctx, consumer, "order-1", 7, event(7).Key, event(7).Body)
		require.NoError(t, err)
	}
	list := func(t *testing.T, b *bundle, f driver.ParkedFilter) []driver.ParkedEvent {
		t.Helper()
		ps, err := b.store.Parked(context.Background(), f)
		require.NoError(t, err)
		return ps
	}

	t.Run("HeldDeadLetterParksTheLaterEvents", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 4))
		require.False(t, b.park(t, event(6), true), "nothing held yet: 6 waits behind a gap, unparked")

		b.hold(t, consumer, "order-1", 5, event(5).Key)
		require.True(t, b.park(t, event(6), true), "parked, then rolled back: that leaves nothing")
		require.Equal(t, []string{"order-1#5H"}, seqs(list(t, b, driver.ParkedFilter{})))

		require.True(t, b.park(t, event(7), false))
		require.True(t, b.park(t, event(6), false))
		require.True(t, b.park(t, event(6), false), "parking again is no error")
		ps := list(t, b, driver.ParkedFilter{Consumer: consumer, Subject: "order-1"})
		require.Equal(t, []string{"order-1#5H", "order-1#6", "order-1#7"}, seqs(ps))
		require.Equal(t, event(5).Key, ps[0].Key)
		want := event(6)
		want.At = t0
		require.Equal(t, want, ps[1], "the message is kept intact")
		require.Empty(t, list(t, b, driver.ParkedFilter{Consumer: "other.consumer"}))
		require.Empty(t, list(t, b, driver.ParkedFilter{Ready: true}))
		require.Len(t, list(t, b, driver.ParkedFilter{Limit: 2}), 2)

		out, err := b.do(ctx, b.uow, consumer, event(6).Key, func(context.Context) error { return nil })
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out, "a parked event is not marked processed")
	})

	t.Run("EffectOfTheHeldEventMakesTheNextReady", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		require.True(t, b.advance(t, consumer, "order-1", 4))
		b.hold(t, consumer, "order-1", 5, event(5).Key)
		require.True(t, b.park(t, event(6), false))
		require.True(t, b.park(t, event(8), false), "parked behind the held 5 and the parked 6")

		require.True(t, b.advance(t, consumer, "order-1", 5))
		require.True(t, b.endWait(t, consumer, "order-1", 5, event(5).Key), "events are parked after 5")
		require.Equal(t, []string{"order-1#6R", "order-1#8"}, seqs(list(t, b, driver.ParkedFilter{})))
		require.Equal(t, []string{"order-1#6R"}, seqs(list(t, b, driver.ParkedFilter{Ready: true})))

		require.True(t, b.advance(t, consumer, "order-1", 6))
		require.True(t, b.endWait(t, consumer, "order-1", 6, event(6).Key), "8 is parked after 6")
		require.Empty(t, list(t, b, driver.ParkedFilter{Ready: true}), "8 waits for 7")
		require.True(t, b.advance(t, consumer, "order-1", 7))
		require.True(t, b.endWait(t, consumer, "order-1", 7, event(7).Key))
		require.Equal(t, []string{"order-1#8R"}, seqs(list(t, b, driver.ParkedFilter{Ready: true})))
		require.True(t, b.advance(t, consumer, "order-1", 8))
		require.False(t, b.endWait(t, consumer, "order-1", 8, event(8).Key), "none left")
		require.Empty(t, list(t, b, driver.ParkedFilter{}))
	})

	t.Run("ReadyBesideTheLastSequence", func(t *testing.T) {
		// A checkpoint at the largest sequence has no next one: the
		// search for ready events must not compute it (on PostgreSQL
		// seq + 1 overflowed bigint and failed the whole listing).
		t.Parallel()
		b := setup(t, newHarness)
		require.True(t, b.advance(t, consumer, "order-1", 4))
		b.hold(t, consumer, "order-1", 5, event(5).Key)
		require.True(t, b.park(t, event(6), false))
		require.True(t, b.advance(t, consumer, "order-1", math.MaxInt64))
		other := func(seq int64) driver.ParkedEvent {
			p := event(seq)
			p.Subject = "order-2"
			return p
		}
		require.True(t, b.advance(t, consumer, "order-2", 1))
		b.hold(t, consumer, "order-2", 2, other(2).Key)
		require.True(t, b.park(t, other(3), false))
		require.True(t, b.advance(t, consumer, "order-2", 2))
		require.True(t, b.endWait(t, consumer, "order-2", 2, event(2).Key))

		all := seqs(list(t, b, driver.ParkedFilter{}))
		require.Contains(t, all, "order-2#3R")
		require.Equal(t, []string{"order-2#3R"}, seqs(list(t, b, driver.ParkedFilter{Ready: true})))
	})

	t.Run("HoldAtOrBelowTheCheckpointIsNotRecorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		require.True(t, b.advance(t, consumer, "order-1", 5))
		b.hold(t, consumer, "order-1", 5, event(5).Key)
		b.hold(t, consumer, "order-1", 3, event(3).Key)
		require.Empty(t, list(t, b, driver.ParkedFilter{}))
		require.Len(t, mustList(t, b.store), 2, "the dead letters are stored")
		require.False(t, b.park(t, event(7), false), "7 waits behind a gap")
	})

	t.Run("HeldDeadLetterReplacesItsParking", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 4))
		b.hold(t, consumer, "order-1", 5, event(5).Key)
		require.True(t, b.park(t, event(6), false))
		// 6's turn came and it failed: its dead letter replaces its
		// parking, or nothing changes. A parked event is the only copy
		// of its message.
		dl := eventDeadLetter(consumer, "order-1", 6, event(6).Key, framework.CodeInvalidPayload)
		bad := dl
		bad.Code = "Not A Code"
		require.Error(t, b.store.HoldDeadLetter(ctx, bad))
		canceled, cancel := context.WithCancel(ctx)
		cancel()
		require.Error(t, b.store.HoldDeadLetter(canceled, dl))
		ps := list(t, b, driver.ParkedFilter{})
		require.Equal(t, []string{"order-1#5H", "order-1#6"}, seqs(ps), "neither held nor dead letter")
		want := event(6)
		want.At = t0
		require.Equal(t, want, ps[1], "the message is kept intact")
		require.Len(t, mustList(t, b.store), 1, "5's dead letter only")

		require.NoError(t, b.store.HoldDeadLetter(ctx, dl))
		require.Equal(t, []string{"order-1#5H", "order-1#6H"}, seqs(list(t, b, driver.ParkedFilter{})))
		dls := mustList(t, b.store)
		require.Len(t, dls, 2)
		require.Equal(t, "e6", dls[1].EventID)
		require.Equal(t, dl.Body, dls[1].Body)
		require.Equal(t, int64(6), dls[1].SubjectSeq)
	})

	// Two events of a subject with one sequence number and different
	// ids: the second neither parks nor holds in the first's place,
	// which would lose the first's message (a parked event's only copy)
	// or its place in the sequence. A wait is no one's place.
	t.Run("ParkNeverTakesAnotherEventsPlace", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		places(t, b)
		for _, seq := range []int64{4, 5, 6} { // parked, held, skipped
			parked, _, err := b.attemptPark(rival(seq), false)
			require.ErrorIs(t, err, driver.ErrSequenceTaken, "#%d", seq)
			require.False(t, parked, "#%d", seq)
			require.NoError(t, b.store.HoldDeadLetter(ctx, eventDeadLetter(consumer, "order-1", seq, rival(seq).Key, framework.CodeSequenceConflict)))
		}
		ps := list(t, b, driver.ParkedFilter{})
		require.Equal(t, []string{"order-1#3H", "order-1#4", "order-1#5H"}, seqs(ps))
		want := event(4)
		want.At = t0
		require.Equal(t, want, ps[1], "the first's message is kept intact")
		require.Equal(t, event(5).Key, ps[2].Key, "the first holds its place")

		require.True(t, b.park(t, event(4), false), "the same event parks again")
		require.True(t, b.park(t, rival(7), false), "in the place of a wait")

		// 3 and then the others take effect in turn: the skip of 6 is
		// still there, and the checkpoint moves past it.
		for seq := int64(3); seq <= 5; seq++ {
			require.True(t, b.advance(t, consumer, "order-1", seq))
			b.endWait(t, consumer, "order-1", seq, event(seq).Key)
		}
		require.Equal(t, int64(6), b.checkpoint(t, consumer, "order-1"), "6 skipped")
	})

	// ParkGap, likewise: another event that waits with the sequence of
	// one parked behind a gap is refused, and the parked one is kept.
	t.Run("ParkGapNeverTakesAnotherEventsPlace", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 4))
		other := rival(6)
		_, err := b.store.WaitGap(ctx, consumer, "order-1", 6, event(6).Key, event(6).Body)
		require.NoError(t, err)
		_, err = b.store.WaitGap(ctx, consumer, "order-1", 6, other.Key, other.Body)
		require.NoError(t, err)
		parked, err := b.store.ParkGap(ctx, other)
		require.NoError(t, err, "a wait is no one's place")
		require.False(t, parked, "the wait is 6's")
		parked, err = b.store.ParkGap(ctx, event(6))
		require.NoError(t, err)
		require.True(t, parked)
		parked, err = b.store.ParkGap(ctx, other)
		require.ErrorIs(t, err, driver.ErrSequenceTaken)
		require.False(t, parked)
		ps := list(t, b, driver.ParkedFilter{})
		require.Len(t, ps, 1)
		require.Equal(t, event(6).Key, ps[0].Key)
		require.Equal(t, event(6).Body, ps[0].Body)
	})

	// EndWait, likewise: another event that took effect at the sequence
	// of a parked, held or skipped one is refused (its effect must roll
	// back), and the other keeps its place; a wait is no one's.
	t.Run("EndWaitNeverEndsAnotherEventsPlace", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		places(t, b)
		for _, seq := range []int64{3, 4, 5, 6} {
			other := rival(seq).Key
			err := b.inTx(ctx, func(ctx context.Context, tx *driver.Tx) error {
				_, err := b.store.EndWait(ctx, tx, consumer, "order-1", seq, other)
				return err
			})
			require.ErrorIs(t, err, driver.ErrSequenceTaken, "#%d", seq)
			_, err = b.store.EndWait(ctx, nil, consumer, "order-1", seq, other)
			require.ErrorIs(t, err, driver.ErrSequenceTaken, "#%d, without a transaction", seq)
		}
		require.Equal(t, []string{"order-1#3H", "order-1#4", "order-1#5H"}, seqs(list(t, b, driver.ParkedFilter{})))
		b.endWait(t, consumer, "order-1", 7, rival(7).Key)
		waited, err := b.store.WaitGap(ctx, consumer, "order-1", 7, event(7).Key, event(7).Body)
		require.NoError(t, err)
		require.Zero(t, waited, "the wait ended with the effect at 7")
		require.True(t, b.endWait(t, consumer, "order-1", 3, event(3).Key), "its own hold: 4 is parked after 3")
		require.Equal(t, []string{"order-1#4", "order-1#5H"}, seqs(list(t, b, driver.ParkedFilter{})))
	})

	t.Run("DeadLetterWithoutSequenceHoldsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		dl := deadLetter(consumer, "e1")
		dl.Subject, dl.SubjectSeq = "", 0
		require.NoError(t, b.store.HoldDeadLetter(context.Background(), dl))
		dl = deadLetter(consumer, "e2")
		dl.Subject, dl.SubjectSeq = "order-1", 0
		require.NoError(t, b.store.HoldDeadLetter(context.Background(), dl))
		require.Empty(t, list(t, b, driver.ParkedFilter{}))
		require.Len(t, mustList(t, b.store), 2, "the dead letters are stored")
	})

	t.Run("FirstEventHeldParksTheNext", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		b.hold(t, consumer, "order-1", 5, event(5).Key)
		require.False(t, b.park(t, event(4), false), "nothing held before 4")
		require.True(t, b.park(t, event(6), false))
	})

	t.Run("ParkGapKeepsTheMessageAndTheWaitsStart", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 4))
		parked, err := b.store.ParkGap(ctx, event(7))
		require.NoError(t, err)
		require.False(t, parked, "7 does not wait")

		_, err = b.store.WaitGap(ctx, consumer, "order-1", 7, event(7).Key, event(7).Body)
		require.NoError(t, err)
		b.clock.Advance(5 * time.Second)
		parked, err = b.store.ParkGap(ctx, event(7))
		require.NoError(t, err)
		require.True(t, parked)
		parked, err = b.store.ParkGap(ctx, event(7))
		require.NoError(t, err)
		require.True(t, parked, "parking again is no error")
		want := event(7)
		want.At = t0
		require.Equal(t, []driver.ParkedEvent{want}, list(t, b, driver.ParkedFilter{}),
			"the message is kept intact, its time is its wait's start")
		b.clock.Advance(time.Minute)
		waited, err := b.store.WaitGap(ctx, consumer, "order-1", 7, event(7).Key, event(7).Body)
		require.NoError(t, err)
		require.Equal(t, time.Minute+5*time.Second, waited, "the wait goes on from its start")
		require.Len(t, list(t, b, driver.ParkedFilter{}), 1, "still parked")

		require.False(t, b.park(t, event(6), false), "6 is before the parked 7: it waits, unparked")
		require.True(t, b.park(t, event(8), false), "8 is parked behind 7")
		require.True(t, b.advance(t, consumer, "order-1", 6))
		require.True(t, b.endWait(t, consumer, "order-1", 6, event(6).Key), "events are parked after 6")
		require.Equal(t, []string{"order-1#7R", "order-1#8"}, seqs(list(t, b, driver.ParkedFilter{})))
		require.True(t, b.advance(t, consumer, "order-1", 7))
		require.True(t, b.endWait(t, consumer, "order-1", 7, event(7).Key))
		require.Equal(t, []string{"order-1#8R"}, seqs(list(t, b, driver.ParkedFilter{})), "7's effect ended its parking")
	})

	t.Run("DeadLetterEndsItsOwnWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 4))
		b.hold(t, consumer, "order-1", 5, event(5).Key)
		_, err := b.store.WaitGap(ctx, consumer, "order-2", 7, event(7).Key, event(7).Body)
		require.NoError(t, err)
		p7 := event(7)
		p7.Subject = "order-2"
		parked, err := b.store.ParkGap(ctx, p7)
		require.NoError(t, err)
		require.True(t, parked)
		_, err = b.store.WaitGap(ctx, consumer, "order-3", 2, event(2).Key, event(2).Body)
		require.NoError(t, err)

		// 7 of order-2 waited too long (sequence_gap): its dead letter
		// ends its parking, in one transaction; a dead letter of another
		// event, or of the same event at another sequence, ends nothing.
		other := framework.Key{Source: "orders", ID: "other"}
		require.NoError(t, b.store.PublishDeadLetter(ctx, eventDeadLetter(consumer, "order-2", 7, other, framework.CodeSequenceGap)))
		require.NoError(t, b.store.PublishDeadLetter(ctx, eventDeadLetter(consumer, "order-2", 8, event(7).Key, framework.CodeSequenceGap)))
		require.Equal(t, []string{"order-1#5H", "order-2#7"}, seqs(list(t, b, driver.ParkedFilter{})))

		require.NoError(t, b.store.PublishDeadLetter(ctx, eventDeadLetter(consumer, "order-2", 7, event(7).Key, framework.CodeSequenceGap)))
		require.Equal(t, []string{"order-1#5H"}, seqs(list(t, b, driver.ParkedFilter{})), "the hold stays")

		// A wait, unparked, ends the same way: its next wait starts
		// afresh.
		b.clock.Advance(time.Hour)
		require.NoError(t, b.store.PublishDeadLetter(ctx, eventDeadLetter(consumer, "order-3", 2, event(2).Key, framework.CodeSequenceGap)))
		waited, err := b.store.WaitGap(ctx, consumer, "order-3", 2, event(2).Key, event(2).Body)
		require.NoError(t, err)
		require.Zero(t, waited)
	})

	t.Run("ParkGapRefusedOnceTheTurnCame", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 4))
		for _, seq := range []int64{5, 7} {
			_, err := b.store.WaitGap(ctx, consumer, "order-1", seq, event(seq).Key, event(seq).Body)
			require.NoError(t, err)
		}
		parked, err := b.store.ParkGap(ctx, event(5))
		require.NoError(t, err)
		require.False(t, parked, "5 follows the checkpoint")

		release := make(chan struct{})
		holder := holdSubject(t, b, consumer, "order-1", true, 6, release)
		result := make(chan subjectResult, 1)
		go func() {
			parked, err := b.store.ParkGap(ctx, event(7))
			result <- subjectResult{moved: parked, err: err}
		}()
		requireStillWaiting(t, result)
		close(release)
		require.NoError(t, <-holder)
		r := <-result
		require.NoError(t, r.err)
		require.False(t, r.moved, "the attempt that moved the checkpoint to 6 committed first: 7's turn came")
		require.Empty(t, list(t, b, driver.ParkedFilter{}))
	})

	t.Run("SkipMovesTheCheckpointPastTheHeldEvent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 4))
		b.hold(t, consumer, "order-1", 5, event(5).Key)
		require.True(t, b.park(t, event(6), false))

		_, err := b.store.Skip(ctx, consumer, "order-1", event(6).Key)
		require.ErrorIs(t, err, driver.ErrNotFound, "6 is parked, not held")
		_, err = b.store.Skip(ctx, consumer, "order-2", event(5).Key)
		require.ErrorIs(t, err, driver.ErrNotFound)
		seq, err := b.store.Skip(ctx, consumer, "order-1", event(5).Key)
		require.NoError(t, err)
		require.Equal(t, int64(5), seq)
		require.Equal(t, int64(5), b.checkpoint(t, consumer, "order-1"))
		require.Equal(t, []string{"order-1#6R"}, seqs(list(t, b, driver.ParkedFilter{})))
		_, err = b.store.Skip(ctx, consumer, "order-1", event(5).Key)
		require.ErrorIs(t, err, driver.ErrNotFound, "skipped once")
	})

	// A dead letter discarded before its turn came (a poison event that
	// overtook the one before it) is skipped alone: the event before it,
	// not arrived yet, still takes effect when it does, and the
	// checkpoint then moves past the skipped one.
	t.Run("SkipBeforeItsTurnSkipsOnlyTheHeldEvent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 2))
		b.hold(t, consumer, "order-1", 4, event(4).Key)
		b.hold(t, consumer, "order-1", 5, event(5).Key) // 3 has not taken effect
		require.True(t, b.park(t, event(6), false))

		seq, err := b.store.Skip(ctx, consumer, "order-1", event(5).Key)
		require.NoError(t, err)
		require.Equal(t, int64(5), seq)
		require.Equal(t, int64(2), b.checkpoint(t, consumer, "order-1"), "3 and 4 are not skipped with 5")
		require.Equal(t, []string{"order-1#4H", "order-1#6"}, seqs(list(t, b, driver.ParkedFilter{})))
		_, err = b.store.Skip(ctx, consumer, "order-1", event(5).Key)
		require.ErrorIs(t, err, driver.ErrNotFound, "skipped once")

		// 3 takes effect; 4 is held still.
		require.True(t, b.advance(t, consumer, "order-1", 3))
		require.True(t, b.endWait(t, consumer, "order-1", 3, event(3).Key))
		require.Equal(t, int64(3), b.checkpoint(t, consumer, "order-1"))

		// 4 is skipped too, now at its turn: the checkpoint moves past
		// 5, and 6 is ready.
		seq, err = b.store.Skip(ctx, consumer, "order-1", event(4).Key)
		require.NoError(t, err)
		require.Equal(t, int64(4), seq)
		require.Equal(t, int64(5), b.checkpoint(t, consumer, "order-1"))
		require.Equal(t, []string{"order-1#6R"}, seqs(list(t, b, driver.ParkedFilter{})))
	})

	t.Run("SkipBeforeItsTurnEndsWithTheEffectBeforeIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.True(t, b.advance(t, consumer, "order-1", 3))
		b.hold(t, consumer, "order-1", 5, event(5).Key) // 4 has not taken effect
		require.True(t, b.park(t, event(6), false))
		_, err := b.store.Skip(ctx, consumer, "order-1", event(5).Key)
		require.NoError(t, err)
		require.Equal(t, int64(3), b.checkpoint(t, consumer, "order-1"))
		require.Equal(t, []string{"order-1#6"}, seqs(list(t, b, driver.ParkedFilter{})))

		// 4 takes effect: its EndWait moves the checkpoint past 5.
		require.True(t, b.advance(t, consumer, "order-1", 4))
		require.True(t, b.endWait(t, consumer, "order-1", 4, event(4).Key), "6 is parked after 4")
		require.Equal(t, int64(5), b.checkpoint(t, consumer, "order-1"))
		require.Equal(t, []string{"order-1#6R"}, seqs(list(t, b, driver.ParkedFilter{})))
	})
}
