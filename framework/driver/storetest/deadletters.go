package storetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// deadLetter returns a dead letter of consumer for event id, with every
// field a store keeps set.
func deadLetter(consumer, id string) driver.DeadLetter {
	return driver.DeadLetter{
		Consumer:      consumer,
		Topic:         "appointments.appointment.booked",
		Source:        "appointments",
		EventID:       id,
		Type:          "appointments.appointment.booked",
		Version:       2,
		Subject:       "appointment-7",
		CorrelationID: "corr-1",
		Code:          framework.CodeInvalidPayload,
		SubjectSeq:    12,
		Attempts:      1,
		Deliveries:    3,
		Body:          []byte(`{"specversion":"1.0","id":"` + id + `"}`),
		Metadata:      map[string]string{"content-type": framework.ContentType, "x": "y"},
	}
}

// resolve resolves the dead letter id as r says, and returns the error.
func resolve(ctx context.Context, s driver.Store, id int64, r driver.Resolution) error {
	_, err := s.ResolveDeadLetter(ctx, id, r)
	return err
}

// requireTime checks that got is the instant want.
func requireTime(t *testing.T, want, got time.Time, field string) {
	t.Helper()
	require.Truef(t, want.Equal(got), "%s: want %s, got %s", field, want, got)
}

// only returns the one dead letter that matches f.
func only(t *testing.T, s driver.Store, f driver.DeadLetterFilter) driver.DeadLetter {
	t.Helper()
	dls, err := s.DeadLetters(context.Background(), f)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	return dls[0]
}

func exerciseDeadLetters(t *testing.T, newHarness func(t *testing.T) Harness) {
	const consumer = "notifications.remind-on-appointment-booked"

	t.Run("PublishStoresEveryField", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		in := deadLetter(consumer, "e-1")
		require.NoError(t, b.store.PublishDeadLetter(ctx, in))

		got := only(t, b.store, driver.DeadLetterFilter{Consumer: consumer})
		require.NotZero(t, got.ID)
		requireTime(t, t0, got.FirstFailedAt, "FirstFailedAt")
		requireTime(t, t0, got.LastFailedAt, "LastFailedAt")
		want := in
		want.ID, want.Status = got.ID, driver.DeadLetterPending
		want.FirstFailedAt, want.LastFailedAt = got.FirstFailedAt, got.LastFailedAt
		require.Equal(t, want, got)

		byID, err := b.store.DeadLetter(ctx, got.ID)
		require.NoError(t, err)
		require.Equal(t, got, byID)

		bare := only(t, b.store, driver.DeadLetterFilter{Consumer: consumer, WithoutBody: true})
		require.Empty(t, bare.Body, "WithoutBody reads no body")
		bare.Body = got.Body
		require.Equal(t, got, bare, "WithoutBody reads every other field")

		h := history(t, b.store, got.ID)
		require.Len(t, h, 1)
		requireTime(t, t0, h[0].At, "At")
		h[0].At = time.Time{}
		require.Equal(t, driver.HistoryEntry{
			Kind: driver.HistoryFailed, Code: in.Code, Attempts: 1, Deliveries: 3,
		}, h[0], "the first failure starts the history")
	})

	t.Run("PublishWithoutEventID", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		body := []byte("not a cloudevent")
		key := framework.BodyKey(body)
		dl := driver.DeadLetter{
			Consumer: consumer, Topic: "t", Source: key.Source, EventID: key.ID,
			Code: framework.CodeMalformedEnvelope, Attempts: 1, Body: body,
		}
		require.NoError(t, b.store.PublishDeadLetter(ctx, dl))
		require.NoError(t, b.store.PublishDeadLetter(ctx, dl))
		got := only(t, b.store, driver.DeadLetterFilter{Consumer: consumer})
		require.Equal(t, key, got.Key())
		require.Equal(t, body, got.Body)
		require.Nil(t, got.Metadata)
		require.Equal(t, 1, got.Repeats)
	})

	t.Run("PublishRejectsIncompleteDeadLetter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		noConsumer := deadLetter("", "e-1")
		require.Error(t, b.store.PublishDeadLetter(ctx, noConsumer))
		noID := deadLetter(consumer, "")
		require.Error(t, b.store.PublishDeadLetter(ctx, noID))
		noCode := deadLetter(consumer, "e-1")
		noCode.Code = ""
		require.Error(t, b.store.PublishDeadLetter(ctx, noCode))
	})

	// A poison message's dead letter takes whatever bytes came: the body
	// is kept as it is, the metadata as driver.StorableMetadata, and
	// the key by framework.BodyKey, so that no store refuses it (the
	// message would come back forever) and every store reads back the same.
	t.Run("PublishTakesAnyMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		body := []byte("{\"specversion\":\"1.0\",\"id\":\"e\\u0000\xff\",\"source\":\"s\x00\"}\x00\xfe")
		key := framework.BodyKey(body)
		sum := sha256.Sum256(body)
		require.Equal(t, framework.Key{ID: "sha256:" + hex.EncodeToString(sum[:])}, key, "the body's digest: its id and source are not storable")
		dl := driver.DeadLetter{
			Consumer: consumer, Topic: "t", Source: key.Source, EventID: key.ID,
			Code: framework.CodeMalformedEnvelope, Body: body,
			Metadata: map[string]string{
				"content-type": framework.ContentType,
				"nul":          "a\x00b",
				"escaped":      `\u0000`,
				"not-utf8":     "a\xff\xfeb",
				"key\x00":      "v",
			},
		}
		require.NoError(t, b.store.PublishDeadLetter(ctx, dl))
		got := only(t, b.store, driver.DeadLetterFilter{Consumer: consumer})
		require.Equal(t, key, got.Key())
		require.Equal(t, body, got.Body, "the body is kept byte for byte")
		require.Equal(t, map[string]string{
			"content-type": framework.ContentType,
			"nul":          "a\uFFFDb",
			"escaped":      `\u0000`,
			"not-utf8":     "a\uFFFDb",
			"key\uFFFD":    "v",
		}, got.Metadata)
	})

	// Text that PostgreSQL cannot hold is refused by every store alike
	// (the dead-letter step never builds it: see framework.BodyKey).
	t.Run("PublishRefusesUnstorableText", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for _, set := range []func(dl *driver.DeadLetter){
			func(dl *driver.DeadLetter) { dl.EventID = "e\x00" },
			func(dl *driver.DeadLetter) { dl.EventID = "e\xff" },
			func(dl *driver.DeadLetter) { dl.Source = "s\x00" },
			func(dl *driver.DeadLetter) { dl.Type = "t\xff" },
			func(dl *driver.DeadLetter) { dl.Subject = "s\x00" },
			func(dl *driver.DeadLetter) { dl.CorrelationID = "c\x00" },
		} {
			dl := deadLetter(consumer, "e-1")
			set(&dl)
			require.Error(t, b.store.PublishDeadLetter(ctx, dl))
		}
		require.Empty(t, mustList(t, b.store))
	})

	// A resolution whose actor or reason PostgreSQL cannot hold is
	// refused by every store alike, naming the part, and changes nothing:
	// PostgreSQL failed the transaction with its own error (an operator's
	// form saw a 500), SQLite stored the NUL.
	t.Run("ResolveRefusesUnstorableText", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		dl := only(t, b.store, driver.DeadLetterFilter{})
		for _, r := range []driver.Resolution{
			{Status: driver.DeadLetterDiscarded, By: "alice", Reason: "a\x00b"},
			{Status: driver.DeadLetterReplayed, By: "alice", Reason: "a\xffb"},
			{Status: driver.DeadLetterDiscarded, By: "al\x00ice", Reason: "junk"},
		} {
			_, err := b.store.ResolveDeadLetter(ctx, dl.ID, r)
			fe, ok := errors.AsType[*framework.FieldError](err)
			require.True(t, ok, "%v", err)
			require.Contains(t, []string{"by", "reason"}, fe.Field)
		}
		require.Equal(t, driver.DeadLetterPending, only(t, b.store, driver.DeadLetterFilter{}).Status)
		require.Len(t, history(t, b.store, dl.ID), 1, "no resolution recorded")
		rs, err := b.store.ClaimReplays(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, rs, "no replay recorded")
	})

	t.Run("RepeatUpdatesTheRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		first := only(t, b.store, driver.DeadLetterFilter{Consumer: consumer})

		later := b.clock.Advance(time.Hour)
		again := deadLetter(consumer, "e-1")
		again.Code, again.Attempts, again.Deliveries, again.SubjectSeq = framework.CodeRetriesExhausted, 5, 0, 13
		require.NoError(t, b.store.PublishDeadLetter(ctx, again))

		got := only(t, b.store, driver.DeadLetterFilter{Consumer: consumer})
		require.Equal(t, first.ID, got.ID)
		require.Equal(t, 1, got.Repeats)
		require.Equal(t, framework.CodeRetriesExhausted, got.Code)
		require.Equal(t, 5, got.Attempts)
		require.Zero(t, got.Deliveries, "the last failure's count")
		require.EqualValues(t, 13, got.SubjectSeq)
		requireTime(t, t0, got.FirstFailedAt, "FirstFailedAt")
		requireTime(t, later, got.LastFailedAt, "LastFailedAt")
		require.Equal(t, driver.DeadLetterPending, got.Status)

		require.NoError(t, b.store.PublishDeadLetter(ctx, again))
		require.Equal(t, 2, only(t, b.store, driver.DeadLetterFilter{Consumer: consumer}).Repeats)
		h := history(t, b.store, first.ID)
		require.Equal(t, []driver.HistoryKind{driver.HistoryFailed, driver.HistoryFailed, driver.HistoryFailed}, kinds(h))
		require.Equal(t, framework.CodeInvalidPayload, h[0].Code, "a repeat never changes an earlier entry")
		require.Equal(t, 3, h[0].Deliveries)
		requireTime(t, t0, h[0].At, "the first failure's time")
		require.Equal(t, framework.CodeRetriesExhausted, h[1].Code)
		require.Equal(t, 5, h[1].Attempts)
		requireTime(t, later, h[1].At, "the repeat's time")

		// The same key for another consumer is another dead letter.
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter("other", "e-1")))
		all, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, all, 2)
	})

	t.Run("FilterAndPage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for i, c := range []struct {
			consumer string
			code     framework.Code
		}{
			{"c1", framework.CodeInvalidPayload},
			{"c2", framework.CodeInvalidPayload},
			{"c1", framework.CodeTimeout},
			{"c1", framework.CodeInvalidPayload},
			{"c1", framework.CodeInvalidPayload},
		} {
			dl := deadLetter(c.consumer, string(rune('a'+i)))
			dl.Code = c.code
			require.NoError(t, b.store.PublishDeadLetter(ctx, dl))
		}
		all, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, all, 5)
		for i := 1; i < len(all); i++ {
			require.Less(t, all[i-1].ID, all[i].ID, "oldest first")
		}
		require.NoError(t, resolve(ctx, b.store, all[4].ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops"}))

		ids := func(f driver.DeadLetterFilter) []string {
			dls, err := b.store.DeadLetters(ctx, f)
			require.NoError(t, err)
			out := []string{}
			for _, dl := range dls {
				out = append(out, dl.EventID)
			}
			return out
		}
		require.Equal(t, []string{"a", "c", "d", "e"}, ids(driver.DeadLetterFilter{Consumer: "c1"}))
		require.Equal(t, []string{"a", "b", "d", "e"}, ids(driver.DeadLetterFilter{Code: framework.CodeInvalidPayload}))
		require.Equal(t, []string{"e"}, ids(driver.DeadLetterFilter{Status: driver.DeadLetterDiscarded}))
		require.Equal(t, []string{"a", "d"}, ids(driver.DeadLetterFilter{
			Consumer: "c1", Code: framework.CodeInvalidPayload, Status: driver.DeadLetterPending,
		}))
		require.Equal(t, []string{}, ids(driver.DeadLetterFilter{Consumer: "nobody"}))

		require.Equal(t, []string{"a", "c"}, ids(driver.DeadLetterFilter{Consumer: "c1", Limit: 2}))
		require.Equal(t, []string{"d", "e"}, ids(driver.DeadLetterFilter{Consumer: "c1", Limit: 2, AfterID: all[2].ID}))
		require.Equal(t, []string{}, ids(driver.DeadLetterFilter{Consumer: "c1", Limit: 2, AfterID: all[4].ID}))

		_, err = b.store.DeadLetters(ctx, driver.DeadLetterFilter{Limit: -1})
		require.Error(t, err)
	})

	t.Run("FilterByEventAndTime", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for i, c := range []struct {
			typ, subject, source string
		}{
			{"orders.order.placed", "order-1", "orders"},
			{"orders.order.placed", "order-2", "orders"},
			{"orders.order.cancelled", "order-1", "orders"},
			{"orders.order.placed", "order-1", "shop"},
		} {
			dl := deadLetter(consumer, string(rune('a'+i)))
			dl.Type, dl.Subject, dl.Source = c.typ, c.subject, c.source
			require.NoError(t, b.store.PublishDeadLetter(ctx, dl))
			b.clock.Advance(time.Hour)
		}
		// A repeat moves the last failure, not the first.
		require.NoError(t, b.store.PublishDeadLetter(ctx, func() driver.DeadLetter {
			dl := deadLetter(consumer, "a")
			dl.Type, dl.Subject, dl.Source = "orders.order.placed", "order-1", "orders"
			return dl
		}()))

		ids := func(f driver.DeadLetterFilter) []string {
			t.Helper()
			dls, err := b.store.DeadLetters(ctx, f)
			require.NoError(t, err)
			out := []string{}
			for _, dl := range dls {
				out = append(out, dl.EventID)
			}
			return out
		}
		require.Equal(t, []string{"a", "b", "d"}, ids(driver.DeadLetterFilter{Type: "orders.order.placed"}))
		require.Equal(t, []string{"a", "c", "d"}, ids(driver.DeadLetterFilter{Subject: "order-1"}))
		require.Equal(t, []string{"d"}, ids(driver.DeadLetterFilter{Source: "shop"}))
		require.Equal(t, []string{"a"}, ids(driver.DeadLetterFilter{Source: "orders", EventID: "a"}))
		require.Equal(t, []string{}, ids(driver.DeadLetterFilter{Source: "shop", EventID: "a"}))
		require.Equal(t, []string{"a", "d"}, ids(driver.DeadLetterFilter{Type: "orders.order.placed", Subject: "order-1"}))

		require.Equal(t, []string{"b", "c", "d"}, ids(driver.DeadLetterFilter{FailedSince: t0.Add(time.Hour)}), "at or after")
		require.Equal(t, []string{"a", "b"}, ids(driver.DeadLetterFilter{FailedBefore: t0.Add(2 * time.Hour)}), "before")
		require.Equal(t, []string{"b"}, ids(driver.DeadLetterFilter{
			FailedSince: t0.Add(time.Hour), FailedBefore: t0.Add(2 * time.Hour),
		}))
		require.Equal(t, []string{"c"}, ids(driver.DeadLetterFilter{
			Subject: "order-1", FailedSince: t0.Add(time.Minute), FailedBefore: t0.Add(3 * time.Hour),
		}))
	})

	t.Run("DefaultLimitIs100", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for i := range 101 {
			require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, fmt.Sprintf("e-%03d", i))))
		}
		dls, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, dls, 100)
	})

	t.Run("Resolve", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		failed := deadLetter(consumer, "e-1")
		failed.Metadata[framework.MetadataRedelivered] = "true"
		require.NoError(t, b.store.PublishDeadLetter(ctx, failed))
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-2")))
		dls, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, dls, 2)

		at := t0.Add(time.Minute)
		replay := driver.Resolution{Status: driver.DeadLetterReplayed, By: "alice", Reason: "fixed the schema", At: at}
		before, err := b.store.ResolveDeadLetter(ctx, dls[0].ID, replay)
		require.NoError(t, err)
		require.Equal(t, dls[0], before, "it returns the dead letter as it was")
		got, err := b.store.DeadLetter(ctx, dls[0].ID)
		require.NoError(t, err)
		require.Equal(t, driver.DeadLetterReplayed, got.Status)
		requireTime(t, at, got.Resolution.At, "Resolution.At")
		got.Resolution.At = at
		require.Equal(t, replay, got.Resolution)

		// The replay is recorded with the resolution, to the consumer
		// alone, as driver.DeadLetter.ReplayMessage makes it.
		rs, err := b.store.ClaimReplays(ctx, 10, 24*time.Hour)
		require.NoError(t, err)
		require.Len(t, rs, 1)
		require.NotZero(t, rs[0].ID)
		requireTime(t, t0, rs[0].CreatedAt, "CreatedAt is the store's time")
		want := before.ReplayMessage()
		require.Equal(t, driver.Replay{
			ID: rs[0].ID, DeadLetterID: before.ID, Consumer: consumer, Topic: before.Topic,
			Body: before.Body, Metadata: map[string]string(want.Metadata), CreatedAt: rs[0].CreatedAt,
		}, rs[0])
		require.NotContains(t, rs[0].Metadata, framework.MetadataRedelivered, "a replay is a first delivery")
		require.Equal(t, strconv.FormatInt(before.ID, 10), rs[0].Metadata[framework.MetadataReplayOf])

		now := b.clock.Advance(time.Hour)
		_, err = b.store.ResolveDeadLetter(ctx, dls[1].ID, driver.Resolution{
			Status: driver.DeadLetterDiscarded, By: "bob", Reason: "test data",
		})
		require.NoError(t, err)
		got, err = b.store.DeadLetter(ctx, dls[1].ID)
		require.NoError(t, err)
		require.Equal(t, driver.DeadLetterDiscarded, got.Status)
		require.Equal(t, "bob", got.Resolution.By)
		require.Equal(t, "test data", got.Resolution.Reason)
		requireTime(t, now, got.Resolution.At, "Resolution.At defaults to now")
		rs, err = b.store.ClaimReplays(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, rs, "a discard replays nothing")

		h := history(t, b.store, dls[1].ID)
		require.Equal(t, []driver.HistoryKind{driver.HistoryFailed, driver.HistoryDiscarded}, kinds(h))
		requireTime(t, now, h[1].At, "the resolution's time")
		require.Equal(t, "bob", h[1].By)
		require.Equal(t, "test data", h[1].Reason)

		_, err = b.store.ResolveDeadLetter(ctx, dls[0].ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "carol"})
		require.ErrorIs(t, err, driver.ErrNotPending, "already resolved")
		require.NotErrorIs(t, err, driver.ErrNotFound)
		require.ErrorContains(t, err, string(driver.DeadLetterReplayed), "the error names the status")
		require.Len(t, history(t, b.store, dls[0].ID), 2, "a refused resolution leaves no trace")
		_, err = b.store.ResolveDeadLetter(ctx, dls[1].ID+1000, replay)
		require.ErrorIs(t, err, driver.ErrNotFound, "missing")
		require.NotErrorIs(t, err, driver.ErrNotPending)
		_, err = b.store.DeadLetter(ctx, dls[1].ID+1000)
		require.ErrorIs(t, err, driver.ErrNotFound)
		_, err = b.store.DeadLetterHistory(ctx, dls[1].ID+1000)
		require.ErrorIs(t, err, driver.ErrNotFound)

		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-3")))
		pending := only(t, b.store, driver.DeadLetterFilter{Status: driver.DeadLetterPending})
		_, err = b.store.ResolveDeadLetter(ctx, pending.ID, driver.Resolution{Status: driver.DeadLetterPending, By: "dave"})
		require.Error(t, err)
		require.NotErrorIs(t, err, driver.ErrNotFound)
		require.NotErrorIs(t, err, driver.ErrNotPending)
	})

	// A message with the key of a dead letter but another body (a
	// producer that sent two bodies under one id, a malformed copy of a
	// failed event) is kept under its body's digest: neither body
	// overwrites the other, and each repeats on its own row.
	t.Run("AnotherBodyUnderItsDigest", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		first := deadLetter(consumer, "e-1")
		require.NoError(t, b.store.PublishDeadLetter(ctx, first))
		other := deadLetter(consumer, "e-1")
		other.Body, other.Code = []byte(`{"specversion":"1.0","id":"e-1","eventversion":1.5}`), framework.CodeMalformedEnvelope
		require.NoError(t, b.store.PublishDeadLetter(ctx, other))
		require.NoError(t, b.store.PublishDeadLetter(ctx, other))
		require.NoError(t, b.store.PublishDeadLetter(ctx, first))

		dls, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: consumer})
		require.NoError(t, err)
		require.Len(t, dls, 2, "one dead letter a body")
		byKey := map[framework.Key]driver.DeadLetter{dls[0].Key(): dls[0], dls[1].Key(): dls[1]}
		kept, ok := byKey[first.Key()]
		require.True(t, ok, "the first body keeps the key")
		require.Equal(t, first.Body, kept.Body)
		require.Equal(t, framework.CodeInvalidPayload, kept.Code)
		require.Equal(t, 1, kept.Repeats)
		digest, ok := byKey[framework.DigestKey(other.Body)]
		require.True(t, ok, "the other body under its digest: %v", byKey)
		require.Equal(t, other.Body, digest.Body)
		require.Equal(t, framework.CodeMalformedEnvelope, digest.Code)
		require.Equal(t, 1, digest.Repeats)
		require.Equal(t, other.Type, digest.Type, "the attributes read are kept")
		require.Len(t, history(t, b.store, digest.ID), 2)
	})

	t.Run("DiscardSettlesTheEvent", func(t *testing.T) { discardSettlesTheEvent(t, newHarness, consumer) })

	// A dead letter that comes back after an operator resolved it (a
	// replay that failed again, or a producer that sent it once more) is
	// pending again on the same row, with one more repeat; its history
	// keeps both failures and the resolution between them. While pending,
	// Resolution is zero: the history holds the earlier ones.
	t.Run("RepeatKeepsTheHistory", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		dl := only(t, b.store, driver.DeadLetterFilter{})
		replayedAt := b.clock.Advance(time.Minute)
		_, err := b.store.ResolveDeadLetter(ctx, dl.ID, driver.Resolution{
			Status: driver.DeadLetterReplayed, By: "alice", Reason: "retry",
		})
		require.NoError(t, err)

		later := b.clock.Advance(time.Hour)
		again := deadLetter(consumer, "e-1")
		again.Code, again.Attempts, again.Deliveries = framework.CodeRetriesExhausted, 5, 0
		require.NoError(t, b.store.PublishDeadLetter(ctx, again))
		got := only(t, b.store, driver.DeadLetterFilter{})
		require.Equal(t, dl.ID, got.ID)
		require.Equal(t, driver.DeadLetterPending, got.Status)
		require.Equal(t, 1, got.Repeats)
		require.Zero(t, got.Resolution, "zero while pending")
		requireTime(t, t0, got.FirstFailedAt, "FirstFailedAt")
		requireTime(t, later, got.LastFailedAt, "LastFailedAt")

		h := history(t, b.store, dl.ID)
		for i := range h {
			h[i].At = h[i].At.UTC().Round(0)
		}
		require.Equal(t, []driver.HistoryEntry{
			{At: t0, Kind: driver.HistoryFailed, Code: framework.CodeInvalidPayload, Attempts: 1, Deliveries: 3},
			{At: replayedAt, Kind: driver.HistoryReplayed, By: "alice", Reason: "retry"},
			{At: later, Kind: driver.HistoryFailed, Code: framework.CodeRetriesExhausted, Attempts: 5},
		}, h)

		discardedAt := b.clock.Advance(time.Minute)
		_, err = b.store.ResolveDeadLetter(ctx, dl.ID, driver.Resolution{
			Status: driver.DeadLetterDiscarded, By: "bob", Reason: "gave up",
		})
		require.NoError(t, err)
		got, err = b.store.DeadLetter(ctx, dl.ID)
		require.NoError(t, err)
		require.Equal(t, "bob", got.Resolution.By, "the last resolution")
		requireTime(t, discardedAt, got.Resolution.At, "Resolution.At")
		require.Equal(t, []driver.HistoryKind{
			driver.HistoryFailed, driver.HistoryReplayed, driver.HistoryFailed, driver.HistoryDiscarded,
		}, kinds(history(t, b.store, dl.ID)))
	})

	// Operators who replay one dead letter at once: one wins, the others
	// are told it is no longer pending, and the message is recorded for
	// replay once.
	t.Run("ConcurrentResolveOneWins", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		dl := only(t, b.store, driver.DeadLetterFilter{})
		const operators = 8
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			errs  = make(chan error, operators)
		)
		for i := range operators {
			wg.Go(func() {
				<-start
				_, err := b.store.ResolveDeadLetter(ctx, dl.ID, driver.Resolution{
					Status: driver.DeadLetterReplayed, By: fmt.Sprintf("op-%d", i), Reason: "race",
				})
				errs <- err
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		won := 0
		for err := range errs {
			if err == nil {
				won++
				continue
			}
			require.ErrorIs(t, err, driver.ErrNotPending)
		}
		require.Equal(t, 1, won, "exactly one operator resolves it")
		rs, err := b.store.ClaimReplays(ctx, 100, time.Minute)
		require.NoError(t, err)
		require.Len(t, rs, 1, "the message is recorded for replay once")
		require.Equal(t, []driver.HistoryKind{driver.HistoryFailed, driver.HistoryReplayed}, kinds(history(t, b.store, dl.ID)))
	})
}

// history returns the history of the dead letter id.
func history(t *testing.T, s driver.Store, id int64) []driver.HistoryEntry {
	t.Helper()
	h, err := s.DeadLetterHistory(context.Background(), id)
	require.NoError(t, err)
	return h
}

// kinds returns the kinds of the entries of h.
func kinds(h []driver.HistoryEntry) []driver.HistoryKind {
	out := make([]driver.HistoryKind, len(h))
	for i, e := range h {
		out[i] = e.Kind
	}
	return out
}
