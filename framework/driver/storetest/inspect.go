package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
)

// ExerciseInspector runs the suite of driver.Inspector, which every
// store of the framework implements: what InspectEvent tells of an event
// produced through the outbox (on a store with a database), applied by one
// consumer and dead-lettered by another, how far the purges deleted, and
// the figures of InspectConsumers. newHarness is as for Exercise.
func ExerciseInspector(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	t.Run("InspectEvent", func(t *testing.T) {
		t.Parallel()
		exerciseInspectEvent(t, newHarness)
	})
	t.Run("PurgeHorizons", func(t *testing.T) {
		t.Parallel()
		exercisePurgeHorizons(t, newHarness)
	})
	t.Run("InspectConsumers", func(t *testing.T) {
		t.Parallel()
		exerciseInspectConsumers(t, newHarness)
	})
}

// The consumers and the event of the inspector's suite.
const (
	applier  = "shop.confirm-order-by-mail"
	rejecter = "billing.charge-on-order-placed"
	placed   = "shop.order.placed"
)

// inspector returns b's store as a driver.Inspector.
func (b *bundle) inspector(t *testing.T) driver.Inspector {
	t.Helper()
	in, ok := b.store.(driver.Inspector)
	require.Truef(t, ok, "%T does not implement driver.Inspector", b.store)
	return in
}

// inspect returns the record of key.
func (b *bundle) inspect(t *testing.T, key framework.Key) driver.EventRecord {
	t.Helper()
	rec, err := b.inspector(t).InspectEvent(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, key, rec.Key)
	return rec
}

// produce adds the event key to the outbox of b's database, at the
// store's clock, and returns the outbox.
func (b *bundle) produce(t *testing.T, key framework.Key, seq int64) *outbox.Outbox {
	t.Helper()
	ctx := context.Background()
	box, err := outbox.New(b.h.DB, outbox.Config{Now: b.clock.Now})
	require.NoError(t, err)
	def := framework.Define[struct{}](placed, 1)
	env, err := def.Envelope(struct{}{}, framework.Attributes{ID: key.ID, Source: key.Source, Subject: "order-1", SubjectSeq: seq})
	require.NoError(t, err)
	tx, err := b.h.DB.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() // a no-op after Commit
	require.NoError(t, box.AddTx(ctx, tx, env))
	require.NoError(t, tx.Commit())
	return box
}

// relay returns a relay of b's database that publishes to nowhere, at the
// store's clock, keeping sent rows for retention.
func (b *bundle) relay(t *testing.T, retention time.Duration) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(b.h.DB, discard{}, outbox.RelayConfig{Retention: retention, Now: b.clock.Now})
	require.NoError(t, err)
	return r
}

// discard is a publisher that drops what it is given.
type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }

func exerciseInspectEvent(t *testing.T, newHarness func(t *testing.T) Harness) {
	ctx := context.Background()

	t.Run("ProducedAppliedAndDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		key := framework.Key{Source: "shop", ID: "order-1-placed"}
		created := b.clock.Now()
		if b.h.DB != nil {
			b.produce(t, key, 1)
		}
		applied := b.clock.Advance(time.Minute)
		out, err := b.do(ctx, b.uow, applier, key, func(context.Context) error { return nil })
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)

		failed := b.clock.Advance(time.Minute)
		dl := deadLetter(rejecter, key.ID)
		dl.Source, dl.Subject, dl.SubjectSeq, dl.Code, dl.Attempts = key.Source, "order-1", 1, framework.CodeHandlerFailed, 3
		require.NoError(t, b.store.HoldDeadLetter(ctx, dl))
		// Another event's dead letter of the same consumer is not this one's.
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(rejecter, "other")))
		refailed := b.clock.Advance(time.Minute)
		require.NoError(t, b.store.PublishDeadLetter(ctx, dl))

		rec := b.inspect(t, key)
		require.True(t, rec.Known())
		if b.h.DB != nil {
			require.NotNil(t, rec.Outbox)
			require.Equal(t, placed, rec.Outbox.Type)
			require.Equal(t, "order-1", rec.Outbox.Subject)
			require.EqualValues(t, 1, rec.Outbox.SubjectSeq)
			requireTime(t, created, rec.Outbox.CreatedAt, "outbox created")
			require.True(t, rec.Outbox.SentAt.IsZero(), "not sent yet")
		}
		require.Len(t, rec.Processed, 1)
		require.Equal(t, applier, rec.Processed[0].Consumer)
		requireTime(t, applied, rec.Processed[0].At, "processed at")

		require.Len(t, rec.DeadLetters, 1, "the rejecter's dead letter of the event, not the other event's")
		got := rec.DeadLetters[0]
		require.Equal(t, rejecter, got.Consumer)
		require.Equal(t, framework.CodeHandlerFailed, got.Code)
		require.Equal(t, 3, got.Attempts)
		require.Equal(t, 1, got.Repeats)
		require.Equal(t, driver.DeadLetterPending, got.Status)
		require.Len(t, got.History, 2, "both failures")
		for i, at := range []time.Time{failed, refailed} {
			require.Equal(t, driver.HistoryFailed, got.History[i].Kind)
			requireTime(t, at, got.History[i].At, "history at")
		}

		require.Len(t, rec.Parked, 1)
		require.Equal(t, rejecter, rec.Parked[0].Consumer)
		require.True(t, rec.Parked[0].Held, "the dead letter holds its subject")
		require.EqualValues(t, 1, rec.Parked[0].Seq)
		require.True(t, rec.Horizons.Processed.IsZero(), "nothing purged")
		require.True(t, rec.Horizons.Outbox.IsZero(), "nothing purged")

		if b.h.DB != nil {
			sentAt := b.clock.Advance(time.Minute)
			n, err := b.relay(t, time.Hour).PublishUnsent(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			requireTime(t, sentAt, b.inspect(t, key).Outbox.SentAt, "sent at")
		}
	})

	t.Run("Parked", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		held := framework.Key{Source: "shop", ID: "1"}
		later := framework.Key{Source: "shop", ID: "2"}
		b.hold(t, rejecter, "order-1", 1, held)
		require.True(t, b.park(t, driver.ParkedEvent{Consumer: rejecter, Subject: "order-1", Seq: 2, Key: later, Topic: placed, Body: []byte("{}")}, false))
		rec := b.inspect(t, later)
		require.True(t, rec.Known())
		require.Empty(t, rec.Processed, "a parked event is not processed")
		require.Len(t, rec.Parked, 1)
		require.False(t, rec.Parked[0].Held)
		require.False(t, rec.Parked[0].Ready, "it waits behind #1")
		require.EqualValues(t, 2, rec.Parked[0].Seq)
		requireTime(t, t0, rec.Parked[0].At, "parked at")
	})

	t.Run("Unknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		out, err := b.do(ctx, b.uow, applier, framework.Key{Source: "shop", ID: "1"}, func(context.Context) error { return nil })
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)
		for _, key := range []framework.Key{{Source: "shop", ID: "2"}, {Source: "other", ID: "1"}, {ID: "1"}} {
			rec := b.inspect(t, key)
			require.Falsef(t, rec.Known(), "%s: %+v", key, rec)
		}
	})

	// Text that no row holds (an operator's typo: NUL, bytes that are not
	// UTF-8) is unknown on every store, as a key or a filter: PostgreSQL
	// refused the query, which the console answered with a 500.
	t.Run("UnstorableText", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		for _, key := range []framework.Key{{Source: "shop\xff", ID: "1"}, {Source: "shop", ID: "1\x00"}} {
			rec := b.inspect(t, key)
			require.Falsef(t, rec.Known(), "%q: %+v", key, rec)
		}
		for _, f := range []driver.DeadLetterFilter{{Consumer: "a\xff"}, {Code: "c\x00"}, {Type: "t\xff"}, {Subject: "s\x00"}, {Source: "s\xff", EventID: "1"}} {
			dls, err := b.store.DeadLetters(ctx, f)
			require.NoError(t, err, "%+v", f)
			require.Empty(t, dls)
		}
		for _, f := range []driver.ParkedFilter{{Consumer: "a\x00"}, {Subject: "s\xff"}} {
			ps, err := b.store.Parked(ctx, f)
			require.NoError(t, err, "%+v", f)
			require.Empty(t, ps)
		}
	})
}

func exercisePurgeHorizons(t *testing.T, newHarness func(t *testing.T) Harness) {
	ctx := context.Background()

	t.Run("Processed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		key := framework.Key{Source: "shop", ID: "1"}
		out, err := b.do(ctx, b.uow, applier, key, func(context.Context) error { return nil })
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)

		n, err := b.store.PurgeProcessed(ctx, t0, 10)
		require.NoError(t, err)
		require.Zero(t, n)
		require.True(t, b.inspect(t, key).Horizons.Processed.IsZero(), "a purge that deleted nothing records no horizon")

		before := t0.Add(time.Minute)
		n, err = b.store.PurgeProcessed(ctx, before, 10)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		rec := b.inspect(t, key)
		require.False(t, rec.Known(), "its mark is gone")
		requireTime(t, before, rec.Horizons.Processed, "processed horizon")
		require.True(t, rec.Horizons.Outbox.IsZero())

		// A later purge of older marks does not move the horizon back.
		b.clock.Advance(-time.Hour)
		out, err = b.do(ctx, b.uow, applier, framework.Key{Source: "shop", ID: "2"}, func(context.Context) error { return nil })
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)
		n, err = b.store.PurgeProcessed(ctx, t0.Add(-time.Minute), 10)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		requireTime(t, before, b.inspect(t, key).Horizons.Processed, "processed horizon")
	})

	t.Run("Outbox", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		if b.h.DB == nil {
			t.Skip("the store has no database, so no outbox")
		}
		key := framework.Key{Source: "shop", ID: "1"}
		b.produce(t, key, 0)
		relay := b.relay(t, time.Hour)
		n, err := relay.Cleanup(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		require.True(t, b.inspect(t, key).Horizons.Outbox.IsZero(), "a cleanup that deleted nothing records no horizon")

		_, err = relay.PublishUnsent(ctx)
		require.NoError(t, err)
		now := b.clock.Advance(2 * time.Hour)
		n, err = relay.Cleanup(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		rec := b.inspect(t, key)
		require.False(t, rec.Known(), "its outbox row is gone")
		requireTime(t, now.Add(-time.Hour), rec.Horizons.Outbox, "outbox horizon")
		require.True(t, rec.Horizons.Processed.IsZero())
	})
}

func exerciseInspectConsumers(t *testing.T, newHarness func(t *testing.T) Harness) {
	ctx := context.Background()
	b := setup(t, newHarness)
	in := b.inspector(t)

	rec, err := in.InspectConsumers(ctx, t0)
	require.NoError(t, err)
	require.Empty(t, rec.Consumers)
	require.Zero(t, rec.Unsent)
	require.True(t, rec.OldestUnsent.IsZero())

	// applier: one mark an hour ago, two since; rejecter: two pending dead
	// letters, a resolved one, and an event parked behind one.
	for i, id := range []string{"1", "2", "3"} {
		if i == 1 {
			b.clock.Advance(time.Hour)
		}
		out, err := b.do(ctx, b.uow, applier, framework.Key{Source: "shop", ID: id}, func(context.Context) error { return nil })
		require.NoError(t, err)
		require.Equal(t, framework.Processed, out)
	}
	for _, id := range []string{"1", "2", "3"} {
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(rejecter, id)))
	}
	resolved := mustList(t, b.store)[2]
	_, err = b.store.ResolveDeadLetter(ctx, resolved.ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "op", Reason: "test"})
	require.NoError(t, err)
	b.hold(t, rejecter, "order-1", 1, framework.Key{Source: "appointments", ID: "1"})
	require.True(t, b.park(t, driver.ParkedEvent{Consumer: rejecter, Subject: "order-1", Seq: 2, Key: framework.Key{Source: "shop", ID: "4"}, Topic: placed, Body: []byte("{}")}, false))
	var oldest time.Time
	if b.h.DB != nil {
		oldest = b.clock.Advance(time.Minute)
		b.produce(t, framework.Key{Source: "shop", ID: "10"}, 0)
		b.clock.Advance(time.Minute)
		b.produce(t, framework.Key{Source: "shop", ID: "11"}, 0)
	}

	rec, err = in.InspectConsumers(ctx, t0.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, []driver.ConsumerFigures{
		{Consumer: rejecter, Processed: 0, PendingDeadLetters: 2, Parked: 1},
		{Consumer: applier, Processed: 2},
	}, rec.Consumers)
	if b.h.DB != nil {
		require.EqualValues(t, 2, rec.Unsent)
		requireTime(t, oldest, rec.OldestUnsent, "oldest unsent")
	}
	rec, err = in.InspectConsumers(ctx, t0)
	require.NoError(t, err)
	require.EqualValues(t, 3, rec.Consumers[1].Processed, "since the first mark, at since")
}
