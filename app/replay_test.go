package app_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/handlers"
)

// testStore returns the store of db, SQLite or PostgreSQL.
func testStore(t *testing.T, db *sqlx.DB) driver.Store {
	t.Helper()
	var (
		store driver.Store
		err   error
	)
	if db.DriverName() == postgres.DriverName {
		store, err = postgres.NewStore(db, postgres.StoreConfig{})
	} else {
		store, err = sqlite.NewStore(db, sqlite.StoreConfig{})
	}
	require.NoError(t, err)
	return store
}

// historyKinds returns the kinds of the history of the dead letter id,
// oldest first.
func historyKinds(t *testing.T, store driver.Store, id int64) []driver.HistoryKind {
	t.Helper()
	hs, err := store.DeadLetterHistory(context.Background(), id)
	require.NoError(t, err)
	kinds := make([]driver.HistoryKind, 0, len(hs))
	for _, h := range hs {
		kinds = append(kinds, h.Kind)
	}
	return kinds
}

// pickyConsumer returns a consumer, named afresh (queues on the shared
// broker outlive the test), that rejects every widget while rejecting
// holds and otherwise records it as "picky:NAME"; with dedup false it
// keeps no processed marks, so that each delivery takes effect. It
// handles only the widgets whose source is its name (publish them with
// bundle.publishFrom): on RabbitMQ the tests share the widget type's
// exchange, so its queue also gets the widgets of the tests running
// beside it, which it acknowledges with no effect and no dead letter.
func pickyConsumer(prefix string, rejecting *atomic.Bool, dedup bool) (string, fx.Option) {
	name := prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	routes := []handlers.Route{handlers.On(widgetAdded, func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
		return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
			if ev.Source != name {
				return nil // another test's
			}
			if rejecting.Load() {
				return framework.Permanent("widget_rejected", errors.New("not today"))
			}
			_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO widgets (name, event_id) VALUES (?, ?)`), "picky:"+ev.Data.Name, ev.ID)
			return err
		}
	})}
	if !dedup {
		routes = append(routes, handlers.WithoutDedup("the test counts every delivery"))
	}
	return name, handlers.Register(name, routes...)
}

// commandOptions are the options of the operator's commands on cfg's
// service with the consumers of opts.
func commandOptions(cfg app.Config, opts ...fx.Option) fx.Option {
	return fx.Options(
		handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
		fx.Supply(widgetMigrations),
		fx.Replace(cfg),
		fx.Options(opts...),
	)
}

// TestReplayFailsAgain replays, in bulk and at once, dead letters whose
// messages fail again as soon as they are delivered, on each transport:
// every one is pending again (none is hidden as replayed), and its
// history holds the first failure, the replay and the new failure.
func TestReplayFailsAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range transportConfigs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.config(t)
			var rejecting atomic.Bool
			rejecting.Store(true)
			name, picky := pickyConsumer("widgets.picky", &rejecting, true)
			b := setup(t, cfg, picky)
			store := testStore(t, b.db)
			const n = 20
			for i := range n {
				b.publishFrom(t, name, fmt.Sprintf("w-%02d", i), "poison")
			}
			// deadLetters lists the consumer's dead letters of status, or all
			// of them for "".
			deadLetters := func(status driver.DeadLetterStatus) []driver.DeadLetter {
				dls, err := store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: name, Status: status})
				require.NoError(t, err)
				return dls
			}
			waitFor(t, "the dead letters", func() bool { return len(deadLetters(driver.DeadLetterPending)) == n })

			out, err := runCommand(t, commandOptions(cfg, picky), "dead-letters", "replay", "--consumer", name, "--by", "tester", "--reason", "try again")
			require.NoError(t, err)
			require.Contains(t, out, fmt.Sprintf("%d replayed, 0 refused", n))
			t.Cleanup(func() {
				if t.Failed() { // what the wait below saw, when it ran out
					for _, dl := range deadLetters("") {
						t.Logf("dead letter %d %s: %s, repeats %d, history %v", dl.ID, dl.Key(), dl.Status, dl.Repeats, historyKinds(t, store, dl.ID))
					}
				}
			})
			waitFor(t, "every replay failed again", func() bool {
				dls := deadLetters("")
				for _, dl := range dls {
					if dl.Repeats < 1 {
						return false
					}
				}
				return len(dls) == n
			})
			dls := deadLetters(driver.DeadLetterPending)
			require.Len(t, dls, n, "a failure after the replay leaves the dead letter pending")
			for _, dl := range dls {
				require.Equal(t, []driver.HistoryKind{driver.HistoryFailed, driver.HistoryReplayed, driver.HistoryFailed},
					historyKinds(t, store, dl.ID), "dead letter %d", dl.ID)
			}
			out, err = runCommand(t, commandOptions(cfg, picky), "dead-letters", "show", fmt.Sprint(dls[0].ID))
			require.NoError(t, err)
			require.Regexp(t, `status\s+pending`, out)
			require.Regexp(t, `(?m)^history:\n\s+\S+\s+failed\s+code widget_rejected, .*\n\s+\S+\s+replayed\s+by tester: try again\n\s+\S+\s+failed\s+code widget_rejected, .*$`, out)
		})
	}
}

// TestReplayConcurrent runs two replay commands of one dead letter at
// once, on each transport: one replays it, the other is refused, naming
// who replayed it; the message is recorded and published once (its
// consumer keeps no processed marks: a second copy would take effect
// twice).
func TestReplayConcurrent(t *testing.T) {
	t.Parallel()
	for _, tc := range transportConfigs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.config(t)
			var rejecting atomic.Bool
			rejecting.Store(true)
			name, picky := pickyConsumer("widgets.undeduped", &rejecting, false)
			b := setup(t, cfg, picky)
			b.publishFrom(t, name, "w-1", "once")
			var id int64
			waitFor(t, "the dead letter", func() bool {
				return b.db.Get(&id, b.db.Rebind(`SELECT id FROM dead_letters WHERE consumer = ?`), name) == nil
			})
			rejecting.Store(false)

			type result struct {
				by, out string
				err     error
			}
			results := make([]result, 2)
			var (
				start sync.WaitGroup
				done  sync.WaitGroup
			)
			start.Add(1)
			for i, by := range []string{"alice", "bob"} {
				done.Add(1)
				go func() {
					defer done.Done()
					start.Wait()
					out, err := runCommand(t, commandOptions(cfg, picky), "dead-letters", "replay", fmt.Sprint(id), "--by", by, "--reason", "fixed")
					results[i] = result{by: by, out: out, err: err}
				}()
			}
			start.Done()
			done.Wait()

			var won, lost []result
			for _, r := range results {
				if r.err == nil {
					won = append(won, r)
				} else {
					lost = append(lost, r)
				}
			}
			require.Len(t, won, 1, "%+v", results)
			require.Len(t, lost, 1, "%+v", results)
			require.Contains(t, won[0].out, fmt.Sprintf("dead letter %d replayed\n", id))
			require.ErrorIs(t, lost[0].err, driver.ErrNotPending)
			require.Regexp(t, fmt.Sprintf(`dead letter %d refused: not pending: replayed by %s at \S+ \(fixed\)`, id, won[0].by), lost[0].out)

			count := func(query string, args ...any) int { return b.count(t, b.db.Rebind(query), args...) }
			waitFor(t, "the replay applied", func() bool {
				return count(`SELECT count(*) FROM widgets WHERE name = 'picky:once'`) >= 1 &&
					count(`SELECT count(*) FROM replays WHERE sent_at IS NULL`) == 0
			})
			require.Equal(t, 1, count(`SELECT count(*) FROM replays WHERE dead_letter_id = ?`, id), "one replay recorded")
			require.Equal(t, 1, count(`SELECT count(*) FROM widgets WHERE name = 'picky:once'`), "one publication")
			require.Equal(t, []driver.HistoryKind{driver.HistoryFailed, driver.HistoryReplayed}, historyKinds(t, testStore(t, b.db), id))
		})
	}
}

// TestReplayBulk replays by filter on SQLite and PostgreSQL, with no
// service running: a dry run lists, in the order of publication (per
// subject by sequence, numerically, then by first failure), what would
// be replayed and what would be refused, and why, and records nothing;
// the replay records them in that order, refuses unless --force a dead
// letter older than processed_retention, and goes on after a refusal.
func TestReplayBulk(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config func(t *testing.T) app.Config
	}{{"SQLite", testConfig}, {"Postgres", postgresConfig}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.config(t)
			cfg.ProcessedRetention = app.Duration(720 * time.Hour)
			var rejecting atomic.Bool
			name, picky := pickyConsumer("widgets.bulk", &rejecting, true)
			other, otherConsumer := pickyConsumer("widgets.other", &rejecting, true)
			opts := commandOptions(cfg, picky, otherConsumer)
			run := func(args ...string) (string, error) {
				return runCommand(t, opts, append(args, "--by", "tester", "--reason", "bulk")...)
			}
			_, err := runCommand(t, opts, "migrate")
			require.NoError(t, err)
			db := openConfigured(t, cfg.DatabaseURL)
			// Stored in this order: each first failed after the one before.
			ids := map[string]int64{}
			for _, d := range []struct {
				event, subject string
				seq            int64
			}{{"s10", "s", 10}, {"s2", "s", 2}, {"a", "", 0}, {"s1", "s", 1}, {"b", "", 0}, {"s3", "s", 3}} {
				ids[d.event] = storeDeadLetter(t, db, name, d.event, d.subject, d.seq)
			}
			ids["other"] = storeDeadLetter(t, db, other, "other-s1", "s", 1)
			ids["gone"] = storeDeadLetter(t, db, "widgets.gone", "gone-1", "", 0)
			old := time.Now().Add(-1000 * time.Hour)
			_, err = db.Exec(db.Rebind(`UPDATE dead_letters SET first_failed_at = ? WHERE id = ?`), timeArg(db, old), ids["s3"])
			require.NoError(t, err)

			out, err := run("dead-letters", "replay", "--consumer", name, "--dry-run")
			require.EqualError(t, err, "1 of 6 dead letters would be refused (each is said above); nothing recorded", "the replay's exit status")
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.Len(t, lines, 7, out)
			for i, want := range []string{
				fmt.Sprintf(`^would replay dead letter %d: consumer %s, code widget_rejected, event widgets/a, first failed \S+$`, ids["a"], regexp.QuoteMeta(name)),
				fmt.Sprintf(`^would replay dead letter %d: .* event widgets/b, first failed`, ids["b"]),
				fmt.Sprintf(`^would replay dead letter %d: .* event widgets/s1, subject s #1, first failed`, ids["s1"]),
				fmt.Sprintf(`^would replay dead letter %d: .* event widgets/s2, subject s #2, first failed`, ids["s2"]),
				fmt.Sprintf(`^would refuse dead letter %d: first failed at \S+, longer ago than processed_retention \(720h0m0s\): a duplicate could no longer be detected \(--force replays it anyway\)$`, ids["s3"]),
				fmt.Sprintf(`^would replay dead letter %d: .* event widgets/s10, subject s #10, first failed`, ids["s10"]),
				`^dry run: 5 would be replayed, 1 refused; nothing recorded$`,
			} {
				require.Regexp(t, want, lines[i])
			}
			replays := func() []int64 {
				var got []int64
				require.NoError(t, db.Select(&got, `SELECT dead_letter_id FROM replays ORDER BY id`))
				return got
			}
			require.Empty(t, replays(), "a dry run records nothing")

			out, err = run("dead-letters", "replay", "--consumer", name, "--rate", "1000")
			require.ErrorContains(t, err, "1 of 6 dead letters refused")
			require.Contains(t, out, fmt.Sprintf("dead letter %d refused: first failed at", ids["s3"]))
			require.Contains(t, out, "5 replayed, 1 refused")
			require.Equal(t, []int64{ids["a"], ids["b"], ids["s1"], ids["s2"], ids["s10"]}, replays(), "recorded, so published, in order")

			out, err = run("dead-letters", "replay", fmt.Sprint(ids["s3"]), "--force")
			require.NoError(t, err)
			require.Contains(t, out, fmt.Sprintf("dead letter %d replayed\n", ids["s3"]))

			out, err = run("dead-letters", "replay", "--subject", "s", "--type", widgetAdded.Type(), "--dry-run")
			require.NoError(t, err)
			require.Regexp(t, fmt.Sprintf(`^would replay dead letter %d: consumer %s, .* subject s #1,`, ids["other"], regexp.QuoteMeta(other)), out, "the others are replayed already")
			out, err = runCommand(t, opts, "dead-letters", "replay", "--until", "2000-01-01", "--dry-run", "--by", "") // a dry run needs no actor, nor reason
			require.NoError(t, err)
			require.Equal(t, "dry run: 0 would be replayed, 0 refused; nothing recorded\n", out)
			out, err = run("dead-letters", "replay", "--since", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), "--code", "widget_rejected")
			require.ErrorContains(t, err, "1 of 2 dead letters refused")
			require.Contains(t, out, fmt.Sprintf("dead letter %d replayed\n", ids["other"]))
			require.Contains(t, out, fmt.Sprintf("dead letter %d refused: consumer widgets.gone is not declared in this service: nothing would consume the replay\n", ids["gone"]))

			_, err = run("dead-letters", "replay", "1", "--consumer", name)
			require.ErrorContains(t, err, "by id or select them by filter, not both")
			_, err = run("dead-letters", "replay")
			require.ErrorContains(t, err, "name dead letters by id, or select them with --consumer")
			_, err = run("dead-letters", "replay", "--consumer", name, "--rate", "-1")
			require.ErrorContains(t, err, "--rate: want a positive number")
			_, err = run("dead-letters", "replay", "--consumer", name, "--rate", "NaN")
			require.ErrorContains(t, err, "--rate: want a positive number")
			_, err = run("dead-letters", "replay", "--consumer", name, "--rate", "1e-9") // one every 31 years: it slept for them
			require.ErrorContains(t, err, "--rate: want at least")
			_, err = runCommand(t, opts, "dead-letters", "list", "--limit", "-1")
			require.EqualError(t, err, "--limit: want 1 or more, got -1")
			_, err = runCommand(t, opts, "dead-letters", "list", "--after", "-1")
			require.ErrorContains(t, err, "--after: want an id")
			_, err = run("dead-letters", "replay", "--since", "yesterday")
			require.ErrorContains(t, err, `--since: want an RFC 3339 time`)
			// Bounds beyond what SQLite's nanoseconds hold, and year 1
			// (the zero time), select what they say: on SQLite --since
			// 9999-12-31 wrapped around and selected every dead letter,
			// and --until 0001-01-01 was no bound at all.
			for _, args := range [][]string{
				{"--since", "9999-12-31T23:59:59Z"},
				{"--since", "2263-01-01"},
				{"--until", "1677-01-01", "--code", "widget_rejected"},
				{"--until", "0001-01-01", "--code", "widget_rejected"},
			} {
				out, err = runCommand(t, opts, append([]string{"dead-letters", "replay", "--dry-run"}, args...)...)
				require.NoError(t, err, "%v", args)
				require.Equal(t, "dry run: 0 would be replayed, 0 refused; nothing recorded\n", out, "%v", args)
			}
			_, err = run("dead-letters", "replay", "--since", "2027-01-01", "--until", "2026-01-01")
			require.ErrorContains(t, err, "--until: want a time after --since")
		})
	}
}

// TestReplaySameIDTwice: a dead letter named twice is replayed (or
// discarded) once, as the dry run says. The dry run said "2 would be
// replayed, 0 refused" of "replay 7 7", and the replay then refused the
// second 7 as replayed by the operator himself, and exited 1.
func TestReplaySameIDTwice(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	var rejecting atomic.Bool
	name, picky := pickyConsumer("widgets.twice", &rejecting, true)
	opts := commandOptions(cfg, picky)
	_, err := runCommand(t, opts, "migrate")
	require.NoError(t, err)
	db := openConfigured(t, cfg.DatabaseURL)
	a, b, c := storeDeadLetter(t, db, name, "a", "", 0), storeDeadLetter(t, db, name, "b", "", 0), storeDeadLetter(t, db, name, "c", "", 0)
	ida, idb, idc := fmt.Sprint(a), fmt.Sprint(b), fmt.Sprint(c)

	out, err := runCommand(t, opts, "dead-letters", "replay", ida, idb, ida, "--dry-run")
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(out, "would replay dead letter "+ida+":"), out)
	require.Contains(t, out, "dry run: 2 would be replayed, 0 refused")

	out, err = runCommand(t, opts, "dead-letters", "replay", ida, idb, ida, "--by", "tester", "--reason", "twice")
	require.NoError(t, err, out)
	require.Contains(t, out, "2 replayed, 0 refused")
	var replayed []int64
	require.NoError(t, db.Select(&replayed, `SELECT dead_letter_id FROM replays ORDER BY id`))
	require.Equal(t, []int64{a, b}, replayed)

	out, err = runCommand(t, opts, "dead-letters", "discard", idc, idc, "--by", "tester", "--reason", "twice")
	require.NoError(t, err, out)
	require.Equal(t, "dead letter "+idc+" discarded\n", out)
}

// timeArg returns t as db's stores keep it: a timestamp on PostgreSQL,
// nanoseconds since the Unix epoch on SQLite.
func timeArg(db *sqlx.DB, t time.Time) any {
	if db.DriverName() == postgres.DriverName {
		return t
	}
	return t.UnixNano()
}

// TestReplayRefusedByTransport replays, on RabbitMQ, a dead letter whose
// stored headers no longer fit in one frame, then another of the same
// consumer recorded after it: the transport refuses the first for good,
// so it is pending again with the code too_large and the failure in its
// history, and the second is published and takes effect instead of
// waiting behind the first for ever.
func TestReplayRefusedByTransport(t *testing.T) {
	t.Parallel()
	cfg := amqpConfig(t)
	var rejecting atomic.Bool
	name, picky := pickyConsumer("widgets.framed", &rejecting, true)
	b := setup(t, cfg, picky)
	store := testStore(t, b.db)
	ctx := t.Context()
	for _, w := range []struct {
		id       string
		metadata map[string]string
	}{
		{"w-big", map[string]string{"blob": strings.Repeat("\uFFFD", 60_000)}}, // 180 kB: over the frame
		{"w-small", nil},
	} {
		env, err := widgetAdded.Envelope(widgetAddedV1{Name: w.id}, framework.Attributes{ID: w.id, Source: name})
		require.NoError(t, err)
		body, err := framework.Encode(env)
		require.NoError(t, err)
		require.NoError(t, store.PublishDeadLetter(ctx, driver.DeadLetter{
			Consumer: name, Topic: widgetAdded.Type(), Source: name, EventID: w.id,
			Type: env.Type, Version: env.Version, Code: "widget_rejected",
			Body: body, Metadata: w.metadata,
		}))
	}
	dls, err := store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: name})
	require.NoError(t, err)
	require.Len(t, dls, 2)
	big := dls[0]
	require.Equal(t, "w-big", big.EventID, "recorded first, so replayed first")

	out, err := runCommand(t, commandOptions(cfg, picky), "dead-letters", "replay", "--consumer", name, "--by", "tester", "--reason", "try again")
	require.NoError(t, err)
	require.Contains(t, out, "2 replayed, 0 refused")
	waitFor(t, "the later replay's effect", func() bool {
		return b.count(t, b.db.Rebind(`SELECT COUNT(*) FROM widgets WHERE name = ?`), "picky:w-small") == 1
	})
	waitFor(t, "the refused replay dead-lettered again", func() bool {
		dl, err := store.DeadLetter(ctx, big.ID)
		require.NoError(t, err)
		return dl.Status == driver.DeadLetterPending
	})
	dl, err := store.DeadLetter(ctx, big.ID)
	require.NoError(t, err)
	require.Equal(t, framework.CodeTooLarge, dl.Code)
	require.Equal(t, 1, dl.Repeats)
	require.Equal(t, []driver.HistoryKind{driver.HistoryFailed, driver.HistoryReplayed, driver.HistoryFailed}, historyKinds(t, store, big.ID))
	require.True(t, b.transport.Ready(), "the refused replay left the connection up")
	require.Zero(t, b.count(t, b.db.Rebind(`SELECT COUNT(*) FROM widgets WHERE name = ?`), "picky:w-big"))
}
