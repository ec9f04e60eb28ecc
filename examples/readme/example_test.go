package main

import (
	"context"
	"fmt"
	"testing/fstest"
	"time"

	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/framework"
)

// schema creates the table the README's handler writes to.
var schema = fstest.MapFS{"00001_reminders.sql": {Data: []byte(`-- +goose Up
CREATE TABLE reminders (appointment_id TEXT NOT NULL, starts_at TEXT NOT NULL, event_id TEXT NOT NULL);
-- +goose Down
DROP TABLE reminders;
`)}}

// The README's consumer, run in the real application on a SQLite file: an
// event delivered twice schedules one reminder, and an event whose data
// fails validation is dead-lettered with its code.
func Example() {
	ctx := context.Background()
	svc, err := apptest.Start(ctx, fx.Options(Module, fx.Supply(app.Migrations{FS: schema})), apptest.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := svc.Close(ctx); err != nil {
			fmt.Println(err)
		}
	}()

	const consumer = "notifications.remind-on-appointment-booked"
	env, err := Booked.Envelope(BookedV1{AppointmentID: "appt-1", StartsAt: time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)},
		framework.Attributes{ID: "evt-1", Source: "appointments"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 2 { // the broker delivers it twice
		res, err := svc.Publish(ctx, env)
		fmt.Println(res[consumer].Outcome, err)
	}
	var reminders []string
	if err := svc.DB().SelectContext(ctx, &reminders, `SELECT appointment_id || ' at ' || starts_at FROM reminders`); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(reminders)

	poison := []byte(`{"specversion":"1.0","id":"evt-2","source":"appointments","type":"appointments.appointment.booked","eventversion":1,"data":{"appointmentId":"appt-2"}}`)
	res, err := svc.PublishBody(ctx, Booked.Type(), poison)
	fmt.Println(res[consumer].Outcome, res[consumer].Code, err)
	// Output:
	// processed <nil>
	// duplicate <nil>
	// [appt-1 at 2030-01-02T10:00:00Z]
	// dead_lettered invalid_payload <nil>
}
