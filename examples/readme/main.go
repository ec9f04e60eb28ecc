// Command readme is the consumer of the README, compiled: a test in
// internal/docs keeps the README's Go block and the code between the
// snippet markers below the same, and this package's Example runs it on
// SQLite. The whole example service is in examples/notifications.
package main

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

// snippet:begin readme

// BookedV1 is the data of version 1 of the event "an appointment was booked".
type BookedV1 struct {
	AppointmentID string    `json:"appointmentId" validate:"required"`
	StartsAt      time.Time `json:"startsAt" validate:"required"`
}

// Booked is the event's contract: its CloudEvents type and version.
var Booked = framework.Define[BookedV1]("appointments.appointment.booked", 1)

// NewRemindOnBooked is the handler's constructor: fx injects the database.
// Writes through framework.Conn join the attempt's transaction, which also
// records the event as processed: one reminder per event, however often
// it is delivered. "?" placeholders and Rebind run on SQLite and PostgreSQL.
func NewRemindOnBooked(db *sqlx.DB) framework.HandlerFunc[BookedV1] {
	insert := db.Rebind(`INSERT INTO reminders (appointment_id, starts_at, event_id) VALUES (?, ?, ?)`)
	return func(ctx context.Context, ev framework.Event[BookedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, insert,
			ev.Data.AppointmentID, ev.Data.StartsAt.UTC().Format(time.RFC3339), ev.ID)
		return err // nil: done; an error: retried; framework.Permanent(code, err): dead-lettered
	}
}

// Module is the service: its consumers (and, in a real one, its migrations).
var Module = handlers.Register("notifications.remind-on-appointment-booked",
	handlers.On(Booked, NewRemindOnBooked),
)

func main() {
	app.Main("notifications", Module)
}

// snippet:end readme
