package runner

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// migratedStore returns the store of a migrated SQLite file of the
// test's own.
func migratedStore(t *testing.T) *sqlite.Store {
	t.Helper()
	db := testenv.SQLite(t)
	require.NoError(t, migrate.Up(t.Context(), db, migrate.Config{}))
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	return store
}

// refusingTransport refuses every replay for good, as RabbitMQ's
// transport refuses headers over a frame.
type refusingTransport struct{}

func (refusingTransport) Replay(context.Context, string, ...*message.Message) error {
	return framework.Permanent(framework.CodeTooLarge, errors.New("does not fit"))
}

// TestReplayRefusedReleasedEvent: a released event (no dead letter of its
// own) and the replay of a dead letter purged since, both refused by the
// transport for good, each become a pending dead letter of their
// consumer with the transport's code, under the event's key, or the
// body's when it is no event; and no replay is left to publish.
func TestReplayRefusedReleasedEvent(t *testing.T) {
	ctx := t.Context()
	store := migratedStore(t)
	body := []byte(`{"specversion":"1.0","id":"e-1","source":"shop","type":"shop.order.placed","eventversion":2,"subject":"o-9","subjectseq":"3","data":{}}`)
	require.NoError(t, store.AddReplays(ctx, []driver.Replay{
		{Consumer: "c.one", Topic: "shop.order.placed", Body: body, Metadata: map[string]string{"k": "v"}},
		{DeadLetterID: 99, Consumer: "c.one", Topic: "shop.order.placed", Body: []byte("not an event")},
	}))
	r := &replayRelay{store: store, transport: refusingTransport{}, logger: slog.New(slog.DiscardHandler)}
	n, err := r.relay(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "none published")

	dls, err := store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: "c.one"})
	require.NoError(t, err)
	require.Len(t, dls, 2)
	event, other := dls[0], dls[1]
	require.Equal(t, framework.Key{Source: "shop", ID: "e-1"}, event.Key())
	require.Equal(t, "shop.order.placed", event.Type)
	require.Equal(t, 2, event.Version)
	require.Equal(t, "o-9", event.Subject)
	require.Equal(t, int64(3), event.SubjectSeq)
	require.Equal(t, map[string]string{"k": "v"}, event.Metadata)
	require.Equal(t, framework.BodyKey([]byte("not an event")), other.Key())
	for _, dl := range dls {
		require.Equal(t, framework.CodeTooLarge, dl.Code)
		require.Equal(t, driver.DeadLetterPending, dl.Status)
	}
	left, err := store.ClaimReplays(ctx, 10, time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, left, "each refused replay is done")
}

// slowTransport takes each replay after a delay, and records when each
// publication began.
type slowTransport struct {
	delay time.Duration
	began []time.Time
	ids   []string
}

func (s *slowTransport) Replay(_ context.Context, _ string, msgs ...*message.Message) error {
	s.began = append(s.began, time.Now())
	time.Sleep(s.delay)
	for _, m := range msgs {
		s.ids = append(s.ids, m.UUID)
	}
	return nil
}

// TestReplayRelayStopsBeforeItsLeaseEnds: a relay whose publications are
// slow publishes none of its claimed replays once less of the lease is
// left than a publication may take (another relay may claim them as the
// lease ends); the next claim after the lease publishes the rest, each
// replay once.
func TestReplayRelayStopsBeforeItsLeaseEnds(t *testing.T) {
	ctx := t.Context()
	store := migratedStore(t)
	const total = 10
	var rs []driver.Replay
	for i := range total {
		body := []byte(`{"specversion":"1.0","id":"e-` + string(rune('a'+i)) + `","source":"shop","type":"shop.order.placed","data":{}}`)
		rs = append(rs, driver.Replay{Consumer: "c.one", Topic: "shop.order.placed", Body: body})
	}
	require.NoError(t, store.AddReplays(ctx, rs))
	tr := &slowTransport{delay: 40 * time.Millisecond}
	lease := 300 * time.Millisecond
	r := &replayRelay{store: store, transport: tr, logger: slog.New(slog.DiscardHandler), lease: lease}

	claimed := time.Now()
	n, err := r.relay(ctx)
	require.NoError(t, err)
	require.Greater(t, n, 0)
	require.Less(t, n, total, "it stopped before publishing replays whose lease was ending")
	for _, at := range tr.began {
		require.True(t, at.Before(claimed.Add(lease-lease/3+10*time.Millisecond)),
			"a publication began %s after the claim, past the lease less a publication's time", at.Sub(claimed))
	}

	published := n
	for deadline := time.Now().Add(30 * time.Second); published < total && time.Now().Before(deadline); {
		time.Sleep(lease + 50*time.Millisecond) // the leases of the rest ended
		n, err := r.relay(ctx)
		require.NoError(t, err)
		published += n
	}
	require.Len(t, tr.ids, total)
	seen := map[string]bool{}
	for _, id := range tr.ids {
		require.False(t, seen[id], "replay %s published twice", id)
		seen[id] = true
	}
}
