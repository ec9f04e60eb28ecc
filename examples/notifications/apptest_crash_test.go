package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestModuleCrash makes a delivery of the service's own Module die at a
// crash point, in the real application (apptest.Config.Crash), and checks
// that one reminder is left: after a death before the commit the
// transport's redelivery is processed; after one past the commit it is a
// duplicate, except where the ack joined the committed transaction (the
// sqlite transport in the stores' file), which delivers nothing again.
func TestModuleCrash(t *testing.T) {
	t.Parallel()
	for _, setup := range []struct {
		name      string
		url       func(t *testing.T) string
		transport string
		ackInTx   bool
	}{
		{"SQLite", func(*testing.T) string { return "" }, app.TransportSQLite, true},
		{"SQLiteMemoryTransport", func(*testing.T) string { return "" }, app.TransportMemory, false},
		{"Postgres", func(t *testing.T) string { return testenv.Require(t, testenv.PostgresURLVar) }, app.TransportSQLite, false},
	} {
		t.Run(setup.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range []struct {
				at        testkit.CrashPoint
				committed bool
			}{
				{testkit.AfterMark, false},
				{testkit.BeforeCommit, false},
				{testkit.AfterCommit, true},
				{testkit.BeforeAck, true},
			} {
				t.Run(string(tc.at), func(t *testing.T) {
					t.Parallel()
					ctx := t.Context()
					// snippet:begin apptest-crash
					svc := apptest.New(t, Module, apptest.Config{
						PostgresURL: setup.url(t), // SQLite when empty
						Transport:   setup.transport,
						Crash:       testkit.CrashOnce(tc.at), // the first delivery to pass tc.at dies there
					})
					env := testkit.Envelope(t, appointments.Booked, appointments.BookedV1{
						AppointmentID: "appt-1",
						StartsAt:      time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC),
					}, framework.Attributes{Source: appointments.Source})

					res, err := svc.Publish(ctx, env)
					require.NoError(t, err)
					testkit.RequireCrashed(t, res[ConsumerName], tc.at)
					// snippet:end apptest-crash
					switch {
					case tc.committed && setup.ackInTx:
						// The ack committed with the effect: nothing is
						// left to deliver.
						require.Zero(t, count(svc.DB(), `SELECT count(*) FROM pubsub_leases WHERE consumer_group = ?`, ConsumerName))
					case tc.committed:
						again, err := svc.Await(ctx, ConsumerName, env.Key()) // the transport delivers it again
						require.NoError(t, err)
						testkit.RequireDuplicate(t, again)
					default:
						again, err := svc.Await(ctx, ConsumerName, env.Key())
						require.NoError(t, err)
						testkit.RequireProcessed(t, again)
					}
					var n int
					require.NoError(t, svc.DB().GetContext(ctx, &n, svc.DB().Rebind(`SELECT count(*) FROM reminders WHERE event_id = ?`), env.ID))
					require.Equal(t, 1, n, "one reminder")
				})
			}
		})
	}
}
