package app_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/middleware"
)

// TestRenamedConsumer renames a consumer between two runs of a service:
// the new name adopts the old one's processed events, so an event the old
// name processed is a duplicate for the new one, not a second effect.
func TestRenamedConsumer(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	run := func(name string, routes []handlers.Route, publish []string, done func(db *sqlx.DB, m *middleware.Metrics) bool) {
		t.Helper()
		var (
			transport driver.Transport
			db        *sqlx.DB
			metrics   *middleware.Metrics
		)
		service := app.New(
			handlers.Register(name, append(routes, handlers.On(widgetAdded, newAddWidget))...),
			fx.Supply(widgetMigrations),
			fx.Replace(cfg),
			fx.Populate(&transport, &db, &metrics),
		)
		require.NoError(t, service.Err())
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, service.Start(ctx))
		b := &bundle{transport: transport, db: db}
		for _, id := range publish {
			b.publish(t, id, "w-"+id)
		}
		waitFor(t, "the events of "+name+" handled", func() bool { return done(db, metrics) })
		require.NoError(t, service.Stop(ctx))
	}
	count := func(db *sqlx.DB, query string, args ...any) int {
		var n int
		require.NoError(t, db.Get(&n, query, args...))
		return n
	}

	run("widgets.counter", nil, []string{"e-1"}, func(db *sqlx.DB, _ *middleware.Metrics) bool {
		return count(db, `SELECT count(*) FROM widgets`) == 1
	})
	// Renamed: e-1 comes again (a redelivery, and the new consumer group
	// reads the topic from its start) together with e-2.
	var widgets, marks int
	run("widgets.tally", []handlers.Route{handlers.RenamedFrom("widgets.counter")}, []string{"e-1", "e-2"},
		func(db *sqlx.DB, m *middleware.Metrics) bool {
			// Outcomes are counted after their commits: read the tables once
			// both are in.
			if testutil.ToFloat64(m.Messages().WithLabelValues("widgets.tally", string(framework.Duplicate))) < 1 ||
				testutil.ToFloat64(m.Messages().WithLabelValues("widgets.tally", string(framework.Processed))) < 1 {
				return false
			}
			widgets = count(db, `SELECT count(*) FROM widgets`)
			marks = count(db, `SELECT count(*) FROM processed_events WHERE consumer = 'widgets.tally'`)
			return true
		})
	require.Equal(t, 2, widgets, "e-1 took effect once under either name")
	require.Equal(t, 2, marks, "the new name holds the adopted mark of e-1 and its own of e-2")
}

// TestRenamedConsumerKeepsItsPlace renames a consumer on each SQL
// transport after its old name dead-lettered an event, which an operator
// discarded. The new name goes on where the old one stopped in the
// topic: the discarded event, which has no processed mark, does not come
// to it again, and does not take effect after all; what was published
// while no process ran does, once, and so does a replay published to the
// old name's replay topic that the old name did not read.
func TestRenamedConsumerKeepsItsPlace(t *testing.T) {
	t.Parallel()
	for _, tc := range transportConfigs[:2] { // SQLite and PostgreSQL: a new queue on RabbitMQ starts empty
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.config(t)
			suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
			def := framework.Define[widgetAddedV1]("rename.widget.added-"+suffix, 1)
			oldName, newName := "widgets.before-"+suffix, "widgets.after-"+suffix
			// The old name refuses "bad" for good; the new one would take it.
			newHandler := func(name string) func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
				return func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
					return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
						if ev.ID == "bad" && name == oldName {
							return framework.Permanent(framework.CodeHandlerFailed, errors.New("refused"))
						}
						_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO widgets (name, event_id) VALUES (?, ?)`), ev.Data.Name, ev.ID)
						return err
					}
				}
			}
			build := func(name string, routes ...handlers.Route) *bundle {
				t.Helper()
				b := &bundle{cfg: cfg, def: &def}
				b.service = app.New(
					handlers.Register(name, append(routes, handlers.On(def, newHandler(name)))...),
					fx.Supply(widgetMigrations),
					fx.Replace(cfg),
					fx.Populate(&b.db, &b.transport),
				)
				require.NoError(t, b.service.Err())
				return b
			}
			start := func(b *bundle) *bundle {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
				defer cancel()
				require.NoError(t, b.service.Start(ctx))
				return b
			}
			stop := func(b *bundle) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
				defer cancel()
				require.NoError(t, b.service.Stop(ctx))
			}

			b := start(build(oldName))
			for _, id := range []string{"e-1", "bad", "e-2"} {
				b.publish(t, id, "w-"+id)
			}
			waitFor(t, "e-1 and e-2 handled, bad dead-lettered", func() bool {
				return b.count(t, `SELECT count(*) FROM widgets`) == 2 &&
					b.count(t, b.db.Rebind(`SELECT count(*) FROM dead_letters WHERE consumer = ?`), oldName) == 1
			})
			store := testStore(t, b.db)
			dls, err := store.DeadLetters(t.Context(), driver.DeadLetterFilter{Consumer: oldName})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			_, err = store.ResolveDeadLetter(t.Context(), dls[0].ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops", Reason: "never", At: time.Now()})
			require.NoError(t, err)
			stop(b)

			// While no process runs, before the rename: e-3 is published,
			// and a replay to the old name, as its replay relay publishes
			// one, which the old name did not read.
			b = build(newName, handlers.RenamedFrom(oldName))
			b.publish(t, "e-3", "w-e-3")
			env, err := def.Envelope(widgetAddedV1{Name: "w-replayed"}, framework.Attributes{ID: "replayed", Source: "widgets"})
			require.NoError(t, err)
			msg, err := framework.NewMessage(env)
			require.NoError(t, err)
			require.NoError(t, b.transport.Replay(t.Context(), oldName, msg))
			start(b)
			b.publish(t, "e-4", "w-e-4")
			waitFor(t, "e-3, e-4 and the replay handled", func() bool {
				return b.count(t, `SELECT count(*) FROM widgets`) >= 5
			})
			time.Sleep(time.Second) // a late handling of bad would show
			var ids []string
			require.NoError(t, b.db.Select(&ids, `SELECT event_id FROM widgets ORDER BY event_id`))
			require.Equal(t, []string{"e-1", "e-2", "e-3", "e-4", "replayed"}, ids, "bad, discarded under the old name, never took effect")
			dl, err := testStore(t, b.db).DeadLetter(t.Context(), dls[0].ID)
			require.NoError(t, err)
			require.Equal(t, driver.DeadLetterDiscarded, dl.Status)
			require.Equal(t, newName, dl.Consumer, "the dead letter adopted")
			stop(b)
		})
	}
}
