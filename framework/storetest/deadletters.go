package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// deadLetter returns a dead letter of consumer for event id, with every
// field a store keeps set.
func deadLetter(consumer, id string) framework.DeadLetter {
	return framework.DeadLetter{
		Consumer:      consumer,
		Topic:         "appointments.appointment.booked",
		Source:        "appointments",
		EventID:       id,
		Type:          "appointments.appointment.booked",
		Version:       2,
		Subject:       "appointment-7",
		CorrelationID: "corr-1",
		Code:          framework.CodeInvalidPayload,
		Attempts:      1,
		Body:          []byte(`{"specversion":"1.0","id":"` + id + `"}`),
		Metadata:      map[string]string{"content-type": framework.ContentType, "x": "y"},
	}
}

// resolve resolves the dead letter id as r says, and returns the error.
func resolve(ctx context.Context, s framework.Store, id int64, r framework.Resolution) error {
	_, err := s.ResolveDeadLetter(ctx, id, r)
	return err
}

// requireTime checks that got is the instant want.
func requireTime(t *testing.T, want, got time.Time, field string) {
	t.Helper()
	require.Truef(t, want.Equal(got), "%s: want %s, got %s", field, want, got)
}

// only returns the one dead letter that matches f.
func only(t *testing.T, s framework.Store, f framework.DeadLetterFilter) framework.DeadLetter {
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

		got := only(t, b.store, framework.DeadLetterFilter{Consumer: consumer})
		require.NotZero(t, got.ID)
		requireTime(t, t0, got.FirstFailedAt, "FirstFailedAt")
		requireTime(t, t0, got.LastFailedAt, "LastFailedAt")
		want := in
		want.ID, want.Status = got.ID, framework.DeadLetterPending
		want.FirstFailedAt, want.LastFailedAt = got.FirstFailedAt, got.LastFailedAt
		require.Equal(t, want, got)

		byID, err := b.store.DeadLetter(ctx, got.ID)
		require.NoError(t, err)
		require.Equal(t, got, byID)
	})

	t.Run("PublishWithoutEventID", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		body := []byte("not a cloudevent")
		key := framework.BodyKey(body)
		dl := framework.DeadLetter{
			Consumer: consumer, Topic: "t", Source: key.Source, EventID: key.ID,
			Code: framework.CodeMalformedEnvelope, Attempts: 1, Body: body,
		}
		require.NoError(t, b.store.PublishDeadLetter(ctx, dl))
		require.NoError(t, b.store.PublishDeadLetter(ctx, dl))
		got := only(t, b.store, framework.DeadLetterFilter{Consumer: consumer})
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
	// is kept as it is, the metadata as framework.StorableMetadata, and
	// the key by framework.KeyOfBody, so that no store refuses it (the
	// message would come back forever) and every store reads back the same.
	t.Run("PublishTakesAnyMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		body := []byte("{\"specversion\":\"1.0\",\"id\":\"e\\u0000\xff\",\"source\":\"s\x00\"}\x00\xfe")
		key := framework.KeyOfBody(body)
		require.Equal(t, framework.BodyKey(body), key)
		dl := framework.DeadLetter{
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
		got := only(t, b.store, framework.DeadLetterFilter{Consumer: consumer})
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
	// (the dead-letter step never builds it: see framework.KeyOfBody).
	t.Run("PublishRefusesUnstorableText", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for _, set := range []func(dl *framework.DeadLetter){
			func(dl *framework.DeadLetter) { dl.EventID = "e\x00" },
			func(dl *framework.DeadLetter) { dl.EventID = "e\xff" },
			func(dl *framework.DeadLetter) { dl.Source = "s\x00" },
			func(dl *framework.DeadLetter) { dl.Type = "t\xff" },
			func(dl *framework.DeadLetter) { dl.Subject = "s\x00" },
			func(dl *framework.DeadLetter) { dl.CorrelationID = "c\x00" },
		} {
			dl := deadLetter(consumer, "e-1")
			set(&dl)
			require.Error(t, b.store.PublishDeadLetter(ctx, dl))
		}
		require.Empty(t, mustList(t, b.store))
	})

	t.Run("RepeatUpdatesTheRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		first := only(t, b.store, framework.DeadLetterFilter{Consumer: consumer})

		later := b.clock.Advance(time.Hour)
		again := deadLetter(consumer, "e-1")
		again.Code, again.Attempts = framework.CodeRetriesExhausted, 5
		require.NoError(t, b.store.PublishDeadLetter(ctx, again))

		got := only(t, b.store, framework.DeadLetterFilter{Consumer: consumer})
		require.Equal(t, first.ID, got.ID)
		require.Equal(t, 1, got.Repeats)
		require.Equal(t, framework.CodeRetriesExhausted, got.Code)
		require.Equal(t, 5, got.Attempts)
		requireTime(t, t0, got.FirstFailedAt, "FirstFailedAt")
		requireTime(t, later, got.LastFailedAt, "LastFailedAt")
		require.Equal(t, framework.DeadLetterPending, got.Status)

		require.NoError(t, b.store.PublishDeadLetter(ctx, again))
		require.Equal(t, 2, only(t, b.store, framework.DeadLetterFilter{Consumer: consumer}).Repeats)

		// The same key for another consumer is another dead letter.
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter("other", "e-1")))
		all, err := b.store.DeadLetters(ctx, framework.DeadLetterFilter{})
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
		all, err := b.store.DeadLetters(ctx, framework.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, all, 5)
		for i := 1; i < len(all); i++ {
			require.Less(t, all[i-1].ID, all[i].ID, "oldest first")
		}
		require.NoError(t, resolve(ctx, b.store, all[4].ID, framework.Resolution{Status: framework.DeadLetterDiscarded, By: "ops"}))

		ids := func(f framework.DeadLetterFilter) []string {
			dls, err := b.store.DeadLetters(ctx, f)
			require.NoError(t, err)
			out := []string{}
			for _, dl := range dls {
				out = append(out, dl.EventID)
			}
			return out
		}
		require.Equal(t, []string{"a", "c", "d", "e"}, ids(framework.DeadLetterFilter{Consumer: "c1"}))
		require.Equal(t, []string{"a", "b", "d", "e"}, ids(framework.DeadLetterFilter{Code: framework.CodeInvalidPayload}))
		require.Equal(t, []string{"e"}, ids(framework.DeadLetterFilter{Status: framework.DeadLetterDiscarded}))
		require.Equal(t, []string{"a", "d"}, ids(framework.DeadLetterFilter{
			Consumer: "c1", Code: framework.CodeInvalidPayload, Status: framework.DeadLetterPending,
		}))
		require.Equal(t, []string{}, ids(framework.DeadLetterFilter{Consumer: "nobody"}))

		require.Equal(t, []string{"a", "c"}, ids(framework.DeadLetterFilter{Consumer: "c1", Limit: 2}))
		require.Equal(t, []string{"d", "e"}, ids(framework.DeadLetterFilter{Consumer: "c1", Limit: 2, AfterID: all[2].ID}))
		require.Equal(t, []string{}, ids(framework.DeadLetterFilter{Consumer: "c1", Limit: 2, AfterID: all[4].ID}))

		_, err = b.store.DeadLetters(ctx, framework.DeadLetterFilter{Limit: -1})
		require.Error(t, err)
	})

	t.Run("DefaultLimitIs100", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		for i := range 101 {
			require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, fmt.Sprintf("e-%03d", i))))
		}
		dls, err := b.store.DeadLetters(ctx, framework.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, dls, 100)
	})

	t.Run("Resolve", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-2")))
		dls, err := b.store.DeadLetters(ctx, framework.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, dls, 2)

		at := t0.Add(time.Minute)
		replay := framework.Resolution{Status: framework.DeadLetterReplayed, By: "alice", Reason: "fixed the schema", At: at}
		require.NoError(t, resolve(ctx, b.store, dls[0].ID, replay))
		got, err := b.store.DeadLetter(ctx, dls[0].ID)
		require.NoError(t, err)
		require.Equal(t, framework.DeadLetterReplayed, got.Status)
		requireTime(t, at, got.Resolution.At, "Resolution.At")
		got.Resolution.At = at
		require.Equal(t, replay, got.Resolution)

		now := b.clock.Advance(time.Hour)
		require.NoError(t, resolve(ctx, b.store, dls[1].ID, framework.Resolution{
			Status: framework.DeadLetterDiscarded, By: "bob", Reason: "test data",
		}))
		got, err = b.store.DeadLetter(ctx, dls[1].ID)
		require.NoError(t, err)
		require.Equal(t, framework.DeadLetterDiscarded, got.Status)
		require.Equal(t, "bob", got.Resolution.By)
		require.Equal(t, "test data", got.Resolution.Reason)
		requireTime(t, now, got.Resolution.At, "Resolution.At defaults to now")

		err = resolve(ctx, b.store, dls[0].ID, framework.Resolution{Status: framework.DeadLetterDiscarded, By: "carol"})
		require.ErrorIs(t, err, framework.ErrNotPending, "already resolved")
		require.NotErrorIs(t, err, framework.ErrNotFound)
		require.ErrorContains(t, err, string(framework.DeadLetterReplayed), "the error names the status")
		err = resolve(ctx, b.store, dls[1].ID+1000, replay)
		require.ErrorIs(t, err, framework.ErrNotFound, "missing")
		_, err = b.store.DeadLetter(ctx, dls[1].ID+1000)
		require.ErrorIs(t, err, framework.ErrNotFound)

		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-3")))
		pending := only(t, b.store, framework.DeadLetterFilter{Status: framework.DeadLetterPending})
		err = resolve(ctx, b.store, pending.ID, framework.Resolution{Status: framework.DeadLetterPending, By: "dave"})
		require.Error(t, err)
		require.NotErrorIs(t, err, framework.ErrNotFound)
	})

	// A dead letter that comes back after an operator resolved it (a
	// replay that failed again, or a producer that sent it once more) is
	// pending again on the same row, with one more repeat and the
	// resolution cleared: the operator must look at it again.
	t.Run("ResolvedComesBackPending", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		dl := only(t, b.store, framework.DeadLetterFilter{})
		require.NoError(t, resolve(ctx, b.store, dl.ID, framework.Resolution{
			Status: framework.DeadLetterReplayed, By: "alice", Reason: "retry",
		}))

		later := b.clock.Advance(time.Hour)
		require.NoError(t, b.store.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		got := only(t, b.store, framework.DeadLetterFilter{})
		require.Equal(t, dl.ID, got.ID)
		require.Equal(t, framework.DeadLetterPending, got.Status)
		require.Equal(t, 1, got.Repeats)
		require.Zero(t, got.Resolution)
		requireTime(t, t0, got.FirstFailedAt, "FirstFailedAt")
		requireTime(t, later, got.LastFailedAt, "LastFailedAt")
		require.NoError(t, resolve(ctx, b.store, dl.ID, framework.Resolution{
			Status: framework.DeadLetterDiscarded, By: "alice",
		}))
	})
}

func exercisePrefix(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Run("PrefixesDoNotInterfere", func(t *testing.T) {
		t.Parallel()
		b := setup(t, newHarness)
		ctx := context.Background()
		a, uowA := b.open(t, "a_")
		c, uowC := b.open(t, "tenant_c_")
		const consumer = "billing.charge"
		key := framework.Key{Source: "orders", ID: "1"}
		nop := func(context.Context) error { return nil }

		for _, uow := range []*framework.UnitOfWork{b.uow, uowA, uowC} {
			out, err := b.do(ctx, uow, consumer, key, nop)
			require.NoError(t, err)
			require.Equal(t, framework.Processed, out)
		}
		out, err := b.do(ctx, uowA, consumer, key, nop)
		require.NoError(t, err)
		require.Equal(t, framework.Duplicate, out)

		n, err := a.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		n, err = c.Count(ctx, consumer, key, 1)
		require.NoError(t, err)
		require.Equal(t, 1, n)

		require.NoError(t, a.PublishDeadLetter(ctx, deadLetter(consumer, "e-1")))
		require.Len(t, mustList(t, a), 1)
		require.Empty(t, mustList(t, c))
		require.Empty(t, mustList(t, b.store))
	})
}

func mustList(t *testing.T, s framework.Store) []framework.DeadLetter {
	t.Helper()
	dls, err := s.DeadLetters(context.Background(), framework.DeadLetterFilter{})
	require.NoError(t, err)
	return dls
}
