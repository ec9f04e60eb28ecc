// Package framework is the core of effectively: event contracts, the
// CloudEvents envelope, typed handlers, and the unit of work that makes an
// event's effect happen exactly once although its delivery is at least
// once.
//
// # Contracts
//
// An event contract is a Definition: a type, a version and the Go type of
// its data, shared by producers and consumers.
//
//	type BookedV1 struct {
//		AppointmentID string    `json:"appointmentId" validate:"required"`
//		StartsAt      time.Time `json:"startsAt" validate:"required"`
//	}
//
//	var Booked = framework.Define[BookedV1]("appointments.appointment.booked", 1)
//
// Every event travels as one CloudEvents 1.0 JSON object (Encode, Decode,
// NewMessage), so producers in any language can publish. Source and id
// identify an event; eventversion, subjectseq and correlationid are
// extensions.
//
// A new version of a contract is a new Definition of the same type. A
// consumer moves on by handling the new version and upcasting the old one
// (Upcast): one handler, both versions, while producers migrate.
//
// # Handlers and consumers
//
// A HandlerFunc handles events of one definition. A Consumer is a stable
// name and its handlers, one per event type and version; the name keys the
// processed events, so renaming it starts a consumer that has processed
// nothing.
//
//	c, err := framework.NewConsumer("notifications.remind-on-appointment-booked",
//		framework.Handle(Booked, func(ctx context.Context, ev framework.Event[BookedV1]) error {
//			_, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO reminders ...`)
//			return err
//		}),
//	)
//
// # Exactly-once effect
//
// The unit of work runs a handler in one transaction that also inserts
// the processed mark of (consumer, source, id). The mark and the
// handler's writes commit together or not at all; a second delivery
// finds the mark and is skipped. With a database, attempts commit in
// groups: several share one transaction, one after another. When one
// fails, the transaction rolls back and the others run again, handler
// included: a handler may run more than once for one delivery, and its
// effect still commits once. The handler, and everything it calls, joins
// the transaction through Conn. Statements that would begin or end it
// fail with ErrEndsTransaction, and those run after the handler returned
// with ErrAttemptEnded. Calls to the outside world are not covered, and
// are made again on every run: pass IdempotencyKeyFromContext to the
// service called (ExampleIdempotencyKeyFromContext).
//
// The package example runs a consumer without a container, on SQLite. The
// middleware package wraps the same unit of work with retries, dead
// letters and a durable delivery count; package app/runner runs it all,
// and package app runs the runner in an fx application.
// Stores and transports, and the unit of work itself, are in package
// driver: a handler needs nothing of it but, for code that must run once
// the effect committed, driver.TxFromContext(ctx) and its OnCommit.
//
// # Errors
//
// A handler returns nil, a plain error (the attempt is retried) or a
// Permanent error with a Code (the message is dead-lettered at once).
// Dead letters keep codes, never error text; ExamplePermanent lists one
// from the store.
package framework
