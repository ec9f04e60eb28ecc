package app_test

import (
	"context"
	"testing"

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
