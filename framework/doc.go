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
// UnitOfWork.Do runs a handler in one transaction that also inserts the
// processed mark of (consumer, source, id). The mark and the handler's
// writes commit together or not at all; a second delivery finds the mark
// and is skipped. With a database, attempts commit in groups
// (UnitOfWorkConfig.BatchSize, DefaultBatchSize by default): several
// share one transaction, one after another, with no savepoint between
// them. When one fails, the transaction rolls back and the others run
// again, handler included, in a new transaction without it: a handler
// may run more than once for one delivery, and its effect still commits
// once. BatchSize 1 gives each attempt a transaction of its own, which
// no other attempt's failure runs again. The handler, and everything it
// calls, joins the transaction through TxFromContext (a *Tx, which has
// no Commit or Rollback: a handler cannot end its batch-mates'
// transaction) or Conn. Calls to the
// outside world are not covered, and are made again on every run: pass
// IdempotencyKeyFromContext to the service called
// (ExampleIdempotencyKeyFromContext).
//
// Consume gives a plain function these semantics without a container
// (ExampleConsume runs it on SQLite). The
// middleware package wraps the same unit of work with retries, dead
// letters and a durable delivery count, and package app runs it all.
//
// # Errors
//
// A handler returns nil, a plain error (the attempt is retried) or a
// Permanent error with a Code (the message is dead-lettered at once).
// Dead letters keep codes, never error text; ExamplePermanent lists one
// from the store.
package framework
