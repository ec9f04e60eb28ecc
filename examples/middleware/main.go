// Command middleware is a service with the application's own middleware
// at both of its places in a consumer's chain, as docs/middleware.md
// explains: RequireTenant around each delivery (app.Middleware.Outer),
// SetTenant and Audit inside each attempt's transaction
// (app.Middleware.Inner). Run it like any service: its migrate command,
// then serve; the tests run it on SQLite and PostgreSQL.
package main

import (
	"context"
	"embed"
	"io/fs"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

// NoteAddedV1 is the data of version 1 of "a note was added".
type NoteAddedV1 struct {
	NoteID string `json:"noteId" validate:"required"`
	Text   string `json:"text" validate:"required"`
}

// NoteAdded is the event's contract. Its producers set the CloudEvents
// extension tenant (see RequireTenant).
var NoteAdded = framework.Define[NoteAddedV1]("notes.note.added", 1)

// Consumer is the name of the consumer that records notes.
const Consumer = "notes.record-note"

// NewRecordNote records a note under the tenant of its event, in the
// attempt's transaction.
func NewRecordNote(db *sqlx.DB) framework.HandlerFunc[NoteAddedV1] {
	insert := db.Rebind(`INSERT INTO notes (tenant, note_id, text) VALUES (?, ?, ?)`)
	return func(ctx context.Context, ev framework.Event[NoteAddedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, insert, TenantFromContext(ctx), ev.Data.NoteID, ev.Data.Text)
		return err
	}
}

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations creates the notes and the audit log.
func Migrations() (app.Migrations, error) {
	sub, err := fs.Sub(migrations, "migrations")
	return app.Migrations{FS: sub}, err
}

// Consumers declares the service's consumer.
var Consumers = handlers.Register(Consumer, handlers.On(NoteAdded, NewRecordNote))

// snippet:begin middleware

// Middleware is the application's own middleware of every consumer:
// RequireTenant once per delivery, then SetTenant and Audit in each
// attempt's transaction, in this order.
var Middleware = app.Middleware{
	Outer: []message.HandlerMiddleware{RequireTenant},
	Inner: []message.HandlerMiddleware{SetTenant, Audit},
}

// Module is the service: its consumer, its middleware and its migrations.
var Module = fx.Options(
	Consumers,
	fx.Supply(Middleware),
	fx.Provide(Migrations),
)

// snippet:end middleware

func main() {
	app.Main("notes", Module)
}
