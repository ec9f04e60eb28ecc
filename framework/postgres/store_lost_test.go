package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestStoreLostStatement: the calls that a consumer's chain makes on a
// message's context, which has no end of its own (a delivery's count,
// its uncount, its dead letter, a peek at its mark, a wait behind a gap
// and its parking), and those of the service's background work on its
// own (the sweep of parked events, the replay relay's claim and its
// reading of a dead letter), give up a statement whose request the
// network lost (a proxy that dropped it, the connection open) once its
// bound passed, instead of waiting for ever. Each call, made again, goes
// through on a new connection.
func TestStoreLostStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(testenv.PostgresURL(t))
	require.NoError(t, err)
	db, err := postgres.Open(ctx, u.String(), postgres.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))

	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	// One connection, so that each call's first statement goes on the
	// connection that the drop cuts off.
	pdb, err := postgres.Open(ctx, u.String(), postgres.OpenConfig{MaxOpenConns: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pdb.Close() })
	store, err := postgres.NewStore(pdb, postgres.StoreConfig{})
	require.NoError(t, err)

	const consumer = "billing.lost"
	key := framework.Key{Source: "billing", ID: "lost-1"}
	dl := driver.DeadLetter{
		Consumer: consumer, Topic: "billing.invoice.created", Source: key.Source, EventID: key.ID,
		Code: framework.CodeInvalidPayload, Body: []byte("{"), Status: driver.DeadLetterPending,
		FirstFailedAt: time.Now(), LastFailedAt: time.Now(),
	}
	gap := driver.ParkedEvent{Consumer: consumer, Subject: "inv-1", Seq: 3, Key: key, Topic: "t", Body: []byte("{}")}
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Count", func(ctx context.Context) error { _, err := store.Count(ctx, consumer, key, 2); return err }},
		{"Uncount", func(ctx context.Context) error { return store.Uncount(ctx, consumer, key) }},
		{"PublishDeadLetter", func(ctx context.Context) error { return store.PublishDeadLetter(ctx, dl) }},
		{"Peek", func(ctx context.Context) error { _, _, err := store.Peek(ctx, consumer, key, ""); return err }},
		{"WaitGap", func(ctx context.Context) error {
			_, err := store.WaitGap(ctx, consumer, gap.Subject, gap.Seq, key, gap.Body)
			return err
		}},
		{"ParkGap", func(ctx context.Context) error { _, err := store.ParkGap(ctx, gap); return err }},
		{"Parked", func(ctx context.Context) error {
			_, err := store.Parked(ctx, driver.ParkedFilter{Consumer: consumer, Ready: true})
			return err
		}},
		{"ClaimReplays", func(ctx context.Context) error { _, err := store.ClaimReplays(ctx, 10, time.Minute); return err }},
		{"DeadLetter", func(ctx context.Context) error {
			_, err := store.DeadLetter(ctx, 1<<40) // none: found or not, the statement ran
			if errors.Is(err, driver.ErrNotFound) {
				return nil
			}
			return err
		}},
	}
	for _, c := range calls {
		require.NoError(t, c.call(ctx), "%s, before the loss", c.name) // the connection is open
		proxy.Drop(true)
		done := make(chan error, 1)
		go func() { done <- c.call(ctx) }()
		time.Sleep(300 * time.Millisecond) // its first statement lost
		proxy.Drop(false)
		select {
		case err := <-done:
			t.Logf("%s, its statement lost: %v", c.name, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s still waits, 20 s on, for the statement the network lost", c.name)
		}
		require.NoError(t, c.call(ctx), "%s, again", c.name)
	}
}
