package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/internal/bulk"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
)

// fakeClock is the clock of a throttle under test: sleeping moves it on,
// and it records each sleep.
type fakeClock struct {
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) throttle(perSecond float64) *bulk.Throttle {
	th := bulk.NewThrottle(perSecond)
	th.Now = func() time.Time { return c.now }
	th.Sleep = func(_ context.Context, d time.Duration) error {
		c.sleeps = append(c.sleeps, d)
		c.now = c.now.Add(d)
		return nil
	}
	return th
}

// TestThrottleSpacesReplays: at --rate 4 the first replay goes at once
// and each next one a quarter of a second after the one before; no
// --rate, no throttle.
func TestThrottleSpacesReplays(t *testing.T) {
	require.Nil(t, bulk.NewThrottle(0))
	require.NoError(t, bulk.NewThrottle(0).Wait(t.Context()), "a nil throttle does not wait")

	clock := &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	th := clock.throttle(4)
	for range 5 {
		require.NoError(t, th.Wait(t.Context()))
	}
	q := 250 * time.Millisecond
	require.Equal(t, []time.Duration{q, q, q, q}, clock.sleeps)
}

// TestProgressOnTerminalOnly: no progress bar where stderr is not a
// terminal (a pipe, a file), nor for one dead letter; the bar counts the
// dead letters done, and each line printed clears it first.
func TestProgressOnTerminalOnly(t *testing.T) {
	require.Nil(t, newProgress(&bytes.Buffer{}, 3))
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer f.Close()
	require.Nil(t, newProgress(f, 3))
	require.Nil(t, newProgress(os.Stderr, 1))

	var screen, out bytes.Buffer
	p := drawProgress(&screen, 3)
	for i := range 3 {
		p.println(&out, "dead letter "+string(rune('1'+i))+" replayed")
		p.add()
	}
	p.finish()
	require.Equal(t, "dead letter 1 replayed\ndead letter 2 replayed\ndead letter 3 replayed\n", out.String())
	require.Contains(t, screen.String(), "replaying")
	require.Contains(t, screen.String(), "(1/3, ", "the count (later draws are throttled)")
}

// TestReplayThrottled: a replay at a rate waits its turn before each dead
// letter it records, not before those it refuses, and a dry run never
// waits (on SQLite).
func TestReplayThrottled(t *testing.T) {
	ctx := t.Context()
	cfg, _, store := migratedSQLite(t)
	for _, dl := range []driver.DeadLetter{
		{Consumer: "c.one", EventID: "e-1", Source: "s", Code: "rejected", Body: []byte(`{}`)},
		{Consumer: "c.one", EventID: "e-2", Source: "s", Code: "rejected", Body: []byte(`{}`)},
		{Consumer: "c.gone", EventID: "e-3", Source: "s", Code: "rejected", Body: []byte(`{}`)},
		{Consumer: "c.one", EventID: "e-4", Source: "s", Code: "rejected", Body: []byte(`{}`)},
	} {
		require.NoError(t, store.PublishDeadLetter(ctx, dl))
	}
	op := operator{cfg: cfg, deadLetters: store, consumers: []string{"c.one"}}
	req := replayRequest{
		ids:        []int64{1, 2, 3, 4},
		resolution: driver.Resolution{Status: driver.DeadLetterReplayed, By: "tester", Reason: "throttled"},
	}

	clock := &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	var out bytes.Buffer
	req.dryRun = true
	require.EqualError(t, op.replay(ctx, &out, &out, req, clock.throttle(2)),
		"1 of 4 dead letters would be refused (each is said above); nothing recorded", "c.gone is not declared")
	require.Empty(t, clock.sleeps, "a dry run records nothing, so it never waits")

	req.dryRun = false
	out.Reset()
	err := op.replay(ctx, &out, &out, req, clock.throttle(2))
	require.ErrorContains(t, err, "1 of 4 dead letters refused")
	require.Equal(t, []time.Duration{500 * time.Millisecond, 500 * time.Millisecond}, clock.sleeps,
		"three replays at 2 a second: the first at once")
	require.Equal(t, 3, strings.Count(out.String(), " replayed\n"), out.String())
	require.Contains(t, out.String(), "dead letter 3 refused: consumer c.gone is not declared in this service")
}

// bodyCounter is a store that counts the bytes of the bodies its
// DeadLetters returns.
type bodyCounter struct {
	driver.Store
	bodyBytes int
}

func (b *bodyCounter) DeadLetters(ctx context.Context, f driver.DeadLetterFilter) ([]driver.DeadLetter, error) {
	dls, err := b.Store.DeadLetters(ctx, f)
	for _, dl := range dls {
		b.bodyBytes += len(dl.Body)
	}
	return dls, err
}

// TestBulkReplayReadsNoBody: a replay by filter selects the dead letters
// without their bodies, which the store reads itself as it records each
// replay. It held every selected dead letter with its body until the
// end: 10,000 too_large dead letters of 1 MB took 10 GB.
func TestBulkReplayReadsNoBody(t *testing.T) {
	ctx := t.Context()
	cfg, db, store := migratedSQLite(t)
	body := []byte(`{"data":"` + strings.Repeat("x", 64<<10) + `"}`)
	for _, id := range []string{"e-1", "e-2"} {
		require.NoError(t, store.PublishDeadLetter(ctx, driver.DeadLetter{Consumer: "c.one", EventID: id, Source: "s", Code: "too_large", Body: body}))
	}
	counter := &bodyCounter{Store: store}
	op := operator{cfg: cfg, deadLetters: counter, consumers: []string{"c.one"}}
	req := replayRequest{
		filter:     driver.DeadLetterFilter{Consumer: "c.one"},
		resolution: driver.Resolution{Status: driver.DeadLetterReplayed, By: "tester", Reason: "bulk"},
	}
	var out bytes.Buffer
	for _, dry := range []bool{true, false} {
		req.dryRun = dry
		require.NoError(t, op.replay(ctx, &out, &out, req, nil))
	}
	require.Contains(t, out.String(), "dry run: 2 would be replayed, 0 refused")
	require.Contains(t, out.String(), "2 replayed, 0 refused")
	require.Zero(t, counter.bodyBytes, "the selection read the bodies")
	var bodies [][]byte
	require.NoError(t, db.Select(&bodies, `SELECT body FROM replays ORDER BY id`))
	require.Equal(t, [][]byte{body, body}, bodies, "each replay carries its message")
}

// migratedSQLite returns the configuration of a service with the default
// settings on a migrated SQLite file of the test's own (the transport
// sqlite, processed marks kept forever), the file's database, closed when
// the test ends, and its store.
func migratedSQLite(t *testing.T) (Config, *sqlx.DB, *sqlite.Store) {
	t.Helper()
	db, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "app.db"), sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrate.Up(t.Context(), db, migrate.Config{}))
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	return Config{Transport: transportSQLite}, db, store
}
