package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestModule runs the service's own Module (its registration with
// handlers.On, the handler's constructor and its migrations) in the real
// application through apptest, on SQLite and on PostgreSQL. The package
// doc of app/apptest shows testReminders.
func TestModule(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		testReminders(t, "")
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		testReminders(t, testenv.Require(t, testenv.PostgresURLVar))
	})
}

// snippet:begin apptest-doc
func testReminders(t *testing.T, postgresURL string) {
	ctx := t.Context()
	svc := apptest.New(t, Module, apptest.Config{PostgresURL: postgresURL}) // SQLite when empty

	env := testkit.Envelope(t, appointments.Booked, appointments.BookedV1{
		AppointmentID: "appt-1",
		StartsAt:      time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC),
	}, framework.Attributes{Source: appointments.Source})
	for _, want := range []framework.Outcome{framework.Processed, framework.Duplicate} { // delivered twice
		res, err := svc.Publish(ctx, env)
		require.NoError(t, err)
		testkit.RequireOutcome(t, res[ConsumerName], want)
	}
	var n int
	require.NoError(t, svc.DB().GetContext(ctx, &n, svc.DB().Rebind(`SELECT count(*) FROM reminders WHERE event_id = ?`), env.ID))
	require.Equal(t, 1, n, "one reminder, however often the event is delivered")

	poison := []byte(`{"specversion":"1.0","id":"p-1","source":"appointments","type":"appointments.appointment.booked","eventversion":1,"data":{"appointmentId":"appt-2"}}`)
	res, err := svc.PublishBody(ctx, appointments.Booked.Type(), poison)
	require.NoError(t, err)
	testkit.RequireDeadLettered(t, res[ConsumerName], framework.CodeInvalidPayload) // startsAt is required

	dls, err := svc.Store().DeadLetters(ctx, driver.DeadLetterFilter{Consumer: ConsumerName})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "p-1", dls[0].EventID)
	require.Equal(t, appointments.Booked.Type(), dls[0].Topic)
}

// snippet:end apptest-doc
