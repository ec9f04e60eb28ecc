package main

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

// ConsumerName is the identity of the reminder consumer.
const ConsumerName = "notifications.remind-on-appointment-booked"

// snippet:begin module

//go:embed migrations/*.sql
var migrations embed.FS

// Module is the notifications service: its consumer and its schema.
var Module = fx.Options(
	handlers.Register(ConsumerName,
		handlers.On(appointments.Booked, NewRemindOnBooked),
	),
	fx.Supply(app.Migrations{FS: mustSub(migrations, "migrations")}),
)

// snippet:end module

// NewRemindOnBooked returns the handler that schedules a reminder for each
// booked appointment. Its insert joins the attempt's transaction, so the
// reminder and the processed mark commit together: one reminder per event,
// however often the event is delivered.
func NewRemindOnBooked(db *sqlx.DB) framework.HandlerFunc[appointments.BookedV1] {
	insert := db.Rebind(`INSERT INTO reminders (appointment_id, starts_at, event_id) VALUES (?, ?, ?)`)
	return func(ctx context.Context, ev framework.Event[appointments.BookedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, insert,
			ev.Data.AppointmentID, ev.Data.StartsAt.UTC().Format(time.RFC3339), ev.ID)
		if err != nil {
			return fmt.Errorf("schedule reminder: %w", err) // no payload value in the error: it is logged
		}
		return nil
	}
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err) // the folder is embedded above
	}
	return sub
}
