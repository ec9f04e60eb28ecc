package app_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestPurger runs a service whose processed marks are kept for an hour:
// the purger deletes in the background a mark made two hours ago (set
// back by the test), and keeps the others.
func TestPurger(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.ProcessedRetention = app.Duration(time.Hour)
	cfg.PurgeInterval = app.Duration(20 * time.Millisecond)
	b := setup(t, cfg)
	b.publish(t, "e-1", "one")
	b.publish(t, "e-2", "two")
	waitFor(t, "the effects", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 2 })
	_, err := b.db.Exec(`UPDATE processed_events SET processed_at = ? WHERE event_id = 'e-1'`, timeArg(b.db, time.Now().Add(-2*time.Hour)))
	require.NoError(t, err)
	waitFor(t, "the old mark purged", func() bool { return b.count(t, `SELECT count(*) FROM processed_events WHERE event_id = 'e-1'`) == 0 })
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM processed_events WHERE event_id = 'e-2'`), "the recent mark stays")
}

// oldRows is how many old processed marks, sent outbox rows and finished
// delivery counts TestPurgeRace seeds: several batches of each.
const oldRows = 2500

// TestPurgeRace purges old records in batches, from two purgers at once
// (one runs, the other finds the lease held), while the service consumes
// recent events, each delivered twice, and finds every guarantee inside
// the retention window kept: each recent event took effect once and keeps
// its mark; the delivery counts of messages still failing (no mark, a dead
// letter replayed, or stored before the message came back) keep their
// count; pending dead letters stay. What is past the window is gone, and
// each purge recorded its horizon.
func TestPurgeRace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config func(t *testing.T) app.Config
	}{{"SQLite", testConfig}, {"PostgreSQL", postgresConfig}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testPurgeRace(t, tc.config(t))
		})
	}
}

// setupRebound is setup with a handler that writes with the database's
// placeholders, SQLite's or PostgreSQL's.
func setupRebound(t *testing.T, cfg app.Config, opts ...fx.Option) *bundle {
	t.Helper()
	return setupWith(t, cfg, handlers.On(widgetAdded, newAddWidgetRebound), opts...)
}

// failingDeliveries is an Outer step that nacks every delivery of the
// event live-fail, and counts them: a message that fails on every
// delivery, as one that kills the process would.
type failingDeliveries struct{ n atomic.Int32 }

func (f *failingDeliveries) middleware(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if ev, _ := framework.EnvelopeFromContext(msg.Context()); ev.ID == "live-fail" {
			f.n.Add(1)
			return nil, errors.New("fails on every delivery")
		}
		return next(msg)
	}
}

func testPurgeRace(t *testing.T, cfg app.Config) {
	const maxDeliveries = 6
	cfg.ProcessedRetention = app.Duration(time.Hour)
	cfg.PurgeInterval = app.Duration(time.Hour) // the test purges
	cfg.Defaults.MaxDeliveries = maxDeliveries
	failing := &failingDeliveries{}
	b := setupRebound(t, cfg, fx.Supply(app.Middleware{Outer: []message.HandlerMiddleware{failing.middleware}}))
	store := testStore(t, b.db)
	ctx := t.Context()
	now := time.Now()
	old, older := now.Add(-2*time.Hour), now.Add(-40*24*time.Hour)
	exec := func(query string, args ...any) {
		t.Helper()
		_, err := b.db.ExecContext(ctx, b.db.Rebind(query), args...)
		require.NoError(t, err)
	}
	series := `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ` + fmt.Sprint(oldRows) + `) `
	exec(`INSERT INTO processed_events (consumer, source, event_id, processed_at) `+series+
		`SELECT ?, 'widgets', 'old-' || i, ? FROM n`, consumerName, timeArg(b.db, old))
	exec(`INSERT INTO deliveries (consumer, source, event_id, count, first_at) `+series+
		`SELECT ?, 'widgets', 'old-' || i, 1, ? FROM n`, consumerName, timeArg(b.db, old))
	exec(`INSERT INTO outbox (event_id, source, type, subject, subject_seq, body, created_at, sent_at) `+series+
		`SELECT 'old-' || i, 'widgets', 'widgets.widget.added', '', 0, ?, ?, ? FROM n`, []byte("{}"), timeArg(b.db, older), timeArg(b.db, older))
	exec(`INSERT INTO replays (dead_letter_id, consumer, topic, body, metadata, created_at, sent_at) `+series+
		`SELECT 0, ?, '', ?, '{}', ?, ? FROM n`, consumerName, []byte("{}"), timeArg(b.db, older), timeArg(b.db, older))

	// Dead letters: one resolved long ago, one resolved recently, one
	// pending long ago.
	resolved := func(id string, at time.Time) int64 {
		dl := storeDeadLetter(t, b.db, consumerName, id, "", 0)
		_, err := store.ResolveDeadLetter(ctx, dl, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "test", Reason: "test", At: at})
		require.NoError(t, err)
		return dl
	}
	oldResolved := resolved("dl-old", older)
	newResolved := resolved("dl-new", now)
	oldPending := storeDeadLetter(t, b.db, consumerName, "dl-pending", "", 0)
	exec(`UPDATE dead_letters SET first_failed_at = ?, last_failed_at = ? WHERE id = ?`, timeArg(b.db, older), timeArg(b.db, older), oldPending)

	// The counts of messages that may still be failing, all recent: none
	// has a mark; one's dead letter was replayed (the replay may fail);
	// one came back after its dead letter was stored.
	count := func(id string, first time.Time) {
		exec(`INSERT INTO deliveries (consumer, source, event_id, count, first_at) VALUES (?, 'widgets', ?, 3, ?)`, consumerName, id, timeArg(b.db, first))
	}
	count("failing", now)
	replayed := storeDeadLetter(t, b.db, consumerName, "replayed", "", 0)
	exec(`UPDATE dead_letters SET status = 'replayed', resolved_at = ? WHERE id = ?`, timeArg(b.db, now), replayed)
	count("replayed", now.Add(-time.Minute))
	storeDeadLetter(t, b.db, consumerName, "back", "", 0)
	count("back", now.Add(time.Minute))
	// Finished: a count begun before its dead letter was stored, and a
	// count of an event marked processed.
	storeDeadLetter(t, b.db, consumerName, "stored", "", 0)
	count("stored", now.Add(-time.Minute))
	count("marked", now)
	exec(`INSERT INTO processed_events (consumer, source, event_id, processed_at) VALUES (?, 'widgets', 'marked', ?)`, consumerName, timeArg(b.db, now))

	// Recent events, each delivered twice, while two purgers race.
	const recent = 100
	var (
		wg     sync.WaitGroup
		purged = make(map[driver.PurgeKind]int64)
		mu     sync.Mutex
		busy   int
	)
	done := make(chan struct{})
	var stop sync.Once
	stopPurgers := func() { stop.Do(func() { close(done) }); wg.Wait() }
	defer stopPurgers() // before the service stops, when the test fails
	for range 2 {
		wg.Add(1)
		purge := app.NewPurge(store, cfg) // one process's purger
		go func() {
			defer wg.Done()
			for {
				rows, err := purge(context.Background())
				mu.Lock()
				for k, n := range rows {
					purged[k] += n
				}
				if errors.Is(err, app.ErrPurgeBusy) {
					busy++
				} else if err != nil {
					t.Errorf("purge: %v", err)
				}
				mu.Unlock()
				select {
				case <-done:
					return
				default:
				}
			}
		}()
	}
	b.publish(t, "live-fail", "f")
	for i := range recent {
		b.publish(t, fmt.Sprintf("new-%d", i), "n")
		b.publish(t, fmt.Sprintf("new-%d", i), "n")
	}
	waitFor(t, "the recent events' effects", func() bool {
		return b.count(t, `SELECT count(*) FROM widgets`) == recent && b.count(t, `SELECT count(*) FROM processed_events WHERE event_id LIKE 'new-%'`) == recent
	})
	waitFor(t, "the old marks purged", func() bool {
		return b.count(t, `SELECT count(*) FROM processed_events WHERE event_id LIKE 'old-%'`) == 0
	})
	waitFor(t, "live-fail's dead letter", func() bool {
		return b.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = 'live-fail'`) == 1
	})
	stopPurgers()
	// One purge more, alone: nothing the race left behind.
	_, err := app.PurgeOnce(ctx, store, cfg)
	require.NoError(t, err)

	require.Zero(t, b.count(t, `SELECT count(*) FROM (SELECT event_id FROM widgets GROUP BY event_id HAVING count(*) > 1) d`), "no effect twice")
	require.Equal(t, recent+1, b.count(t, `SELECT count(*) FROM processed_events`), "the recent marks stay")
	require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM replays WHERE dead_letter_id = 0`), "sent replays past replay_retention")
	var counts []struct {
		EventID string `db:"event_id"`
		Count   int    `db:"count"`
	}
	require.NoError(t, b.db.SelectContext(ctx, &counts, `SELECT event_id, count FROM deliveries ORDER BY event_id`))
	require.Equal(t, []struct {
		EventID string `db:"event_id"`
		Count   int    `db:"count"`
	}{{"back", 3}, {"failing", 3}, {"replayed", 3}}, counts, "the counts of messages still failing, and only those")
	var ids []int64
	require.NoError(t, b.db.SelectContext(ctx, &ids, `SELECT id FROM dead_letters ORDER BY id`))
	require.NotContains(t, ids, oldResolved)
	require.Contains(t, ids, newResolved)
	require.Contains(t, ids, oldPending, "a pending dead letter is never purged")
	require.Zero(t, b.count(t, b.db.Rebind(`SELECT count(*) FROM dead_letter_history WHERE dead_letter_id = ?`), oldResolved), "its history with it")

	mu.Lock()
	defer mu.Unlock()
	var code string
	require.NoError(t, b.db.GetContext(ctx, &code, `SELECT code FROM dead_letters WHERE event_id = 'live-fail'`))
	require.Equal(t, string(framework.CodeDeliveryLimit), code)
	require.LessOrEqual(t, int(failing.n.Load()), maxDeliveries, "its delivery count never started again")

	// The service's own purger, which runs at start, races too.
	require.Positive(t, busy, "the purgers took turns")

	rec, err := store.(driver.Inspector).InspectEvent(ctx, framework.Key{Source: "widgets", ID: "old-1"})
	require.NoError(t, err)
	require.False(t, rec.Horizons.Processed.IsZero())
	require.False(t, rec.Horizons.Outbox.IsZero())
	require.False(t, rec.Horizons.DeadLetters.IsZero())
}

// migratedForPurge returns cfg with marks kept an hour and the service's
// own purge hourly, once a service of it migrated its database and
// stopped: it purges at start, and would take the test's purges from it
// while it runs. A stop that cuts that purge short gives the release of
// its lease a moment only (the lease then ends by itself, in
// purge.LeaseTTL): on a loaded machine the release missed it, and the
// lease, held two minutes more, outlasted the test's wait for it. So the
// stopped service's lease is deleted here.
func migratedForPurge(t *testing.T, cfg app.Config) app.Config {
	t.Helper()
	cfg.ProcessedRetention = app.Duration(time.Hour)
	cfg.PurgeInterval = app.Duration(time.Hour)
	b := setupRebound(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(t, b.service.Stop(ctx))
	_, err := openConfigured(t, cfg.DatabaseURL).ExecContext(ctx, `DELETE FROM leases WHERE name = 'purge'`)
	require.NoError(t, err)
	return cfg
}

// TestPurgeLease: while another process holds the purge's lease, a purge
// deletes nothing and says so; once the lease ends, it purges.
func TestPurgeLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config func(t *testing.T) app.Config
	}{{"SQLite", testConfig}, {"PostgreSQL", postgresConfig}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := migratedForPurge(t, tc.config(t))
			db := openConfigured(t, cfg.DatabaseURL)
			count := func() (n int) {
				require.NoError(t, db.Get(&n, `SELECT count(*) FROM processed_events`))
				return n
			}
			store := testStore(t, db)
			purger := store.(driver.Purger)
			waitFor(t, "the lease taken", func() bool {
				ok, err := purger.AcquireLease(t.Context(), "purge", "elsewhere", time.Hour)
				require.NoError(t, err)
				return ok
			})
			// Written while the lease is held: no purge can take it.
			_, err := db.Exec(db.Rebind(`INSERT INTO processed_events (consumer, source, event_id, processed_at) VALUES (?, 'widgets', 'old', ?)`),
				consumerName, timeArg(db, time.Now().Add(-2*time.Hour)))
			require.NoError(t, err)

			_, err = app.PurgeOnce(t.Context(), store, cfg)
			require.ErrorIs(t, err, app.ErrPurgeBusy)
			require.Equal(t, 1, count())

			require.NoError(t, purger.ReleaseLease(t.Context(), "purge", "elsewhere"))
			rows, err := app.PurgeOnce(t.Context(), store, cfg)
			require.NoError(t, err)
			require.EqualValues(t, 1, rows[driver.PurgeProcessed])
			require.Zero(t, count())
		})
	}
}

// TestPurgeCommand: purge --dry-run prints what the purge would delete
// and deletes nothing; purge deletes it, and events show then says the
// evidence was purged; while another process purges, the command fails.
func TestPurgeCommand(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.ProcessedRetention = app.Duration(time.Hour)
	opts := commandOptions(cfg)
	_, err := runCommand(t, opts, "migrate")
	require.NoError(t, err)
	db := openConfigured(t, cfg.DatabaseURL)
	old := time.Now().Add(-40 * 24 * time.Hour)
	for _, id := range []string{"old-1", "old-2", "old-3"} {
		_, err := db.Exec(`INSERT INTO processed_events (consumer, source, event_id, processed_at) VALUES (?, 'widgets', ?, ?)`, consumerName, id, old.UnixNano())
		require.NoError(t, err)
	}
	dl := storeDeadLetter(t, db, consumerName, "old-1", "", 0)
	_, err = testStore(t, db).ResolveDeadLetter(t.Context(), dl, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops", Reason: "obsolete", At: old})
	require.NoError(t, err)
	marks := func() int {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM processed_events`))
		return n
	}

	out, err := runCommand(t, opts, "purge", "--dry-run")
	require.NoError(t, err)
	require.Regexp(t, `processed marks\s+\S+\s+3\n`, out)
	require.Regexp(t, `resolved dead letters\s+\S+\s+1\n`, out)
	require.Contains(t, out, "would delete")
	require.Equal(t, 3, marks(), "a dry run deletes nothing")

	out, err = runCommand(t, opts, "purge")
	require.NoError(t, err)
	require.Regexp(t, `processed marks\s+\S+\s+3\n`, out)
	require.Regexp(t, `resolved dead letters\s+\S+\s+1\n`, out)
	require.Zero(t, marks())

	out, err = runCommand(t, opts, "events", "show", "widgets", "old-1")
	require.NoError(t, err)
	require.Contains(t, out, "marks processed before")
	require.Contains(t, out, "dead letters resolved before")

	ok, err := testStore(t, db).(driver.Purger).AcquireLease(t.Context(), "purge", "elsewhere", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = runCommand(t, opts, "purge")
	require.ErrorContains(t, err, "another process of the service is purging")
}

// TestPurgeStopsPromptly: a purge cut short by the service's stop while
// another process holds the SQLite file's write lock (an attempt of a
// slow handler, say) returns at once, without waiting behind that lock
// to release its lease: the release took 5 s of the stop, which the
// runner needs to drain its attempts. The lease ends by itself.
func TestPurgeStopsPromptly(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	b := setupRebound(t, cfg)
	stopCtx, cancelStop := context.WithTimeout(context.Background(), waitLimit)
	defer cancelStop()
	require.NoError(t, b.service.Stop(stopCtx))
	db := openConfigured(t, cfg.DatabaseURL)
	holder := openConfigured(t, cfg.DatabaseURL) // a pool of its own: another process
	tx, err := holder.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = tx.Exec(`INSERT INTO widgets (name, event_id) VALUES ('held', 'held')`)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond) // the stop
	defer cancel()
	start := time.Now()
	_, err = app.PurgeOnce(ctx, testStore(t, db), cfg)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second, "the purge waited behind the write lock after the stop")
}

// TestPurgeLostStatement: a purge whose request the network lost (a
// proxy that dropped it, the connection open) gives that statement up
// once its bound passed and goes on, on a new connection, instead of
// waiting for ever with the purge's lease held (and, had the answer of a
// batch's statement been lost, its transaction open).
func TestPurgeLostStatement(t *testing.T) {
	t.Parallel()
	cfg := migratedForPurge(t, postgresConfig(t))
	ctx := t.Context()
	u, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	db := openConfigured(t, u.String())
	store := testStore(t, db)
	waitFor(t, "the purge's lease", func() bool { // the service's, released as it stopped
		_, err := app.PurgeOnce(ctx, store, cfg)
		return err == nil
	})
	_, err = db.Exec(db.Rebind(`INSERT INTO processed_events (consumer, source, event_id, processed_at) VALUES (?, 'widgets', 'old', ?)`),
		consumerName, timeArg(db, time.Now().Add(-2*time.Hour)))
	require.NoError(t, err)

	proxy.Drop(true)
	type result struct {
		rows map[driver.PurgeKind]int64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		rows, err := app.PurgeOnce(context.Background(), store, cfg)
		done <- result{rows, err}
	}()
	time.Sleep(300 * time.Millisecond) // its first statement lost
	proxy.Drop(false)
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.EqualValues(t, 1, r.rows[driver.PurgeProcessed])
	case <-time.After(waitLimit):
		t.Fatalf("the purge still waits, %s on, for the statement the network lost", waitLimit)
	}
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM processed_events`))
	require.Zero(t, n)
}
