// Package outbox records events to publish in the same database
// transaction as the writes that cause them, and relays them to the
// transport after that transaction commits.
//
// A handler cannot publish to a broker and commit its writes atomically:
// publishing first may announce a change that then rolls back, committing
// first may lose the event in a crash. The outbox writes the event into a
// table in the handler's own transaction instead; a Relay reads the table
// and publishes each row after the commit. A rolled-back attempt leaves
// no row, so nothing is published; a committed one is published at least
// once. The package's Example shows both on SQLite.
//
// # Recording an event in a handler
//
// Inside a handler the attempt's transaction travels in ctx, and Add joins
// it. Here a consumer records a follow-up event, and an intent to send an
// e-mail that another consumer (the one that talks to the mail provider,
// with the framework's idempotency key) carries out:
//
//	func newRemind(db *sqlx.DB, box *outbox.Outbox) framework.HandlerFunc[BookedV1] {
//		return func(ctx context.Context, ev framework.Event[BookedV1]) error {
//			if _, err := framework.Conn(ctx, db).ExecContext(ctx,
//				`INSERT INTO reminders (appointment_id) VALUES (?)`, ev.Data.AppointmentID); err != nil {
//				return fmt.Errorf("insert reminder: %w", err)
//			}
//			env, err := emailRequested.Envelope(EmailRequestedV1{To: ev.Data.Email, Template: "reminder"},
//				framework.Attributes{
//					ID:            framework.FollowUpID(ev.Key(), "reminder-mail"), // the same on every retry
//					Source:        "notifications",
//					Subject:       ev.Subject,
//					CorrelationID: ev.CorrelationID,
//				})
//			if err != nil {
//				return err
//			}
//			return box.Add(ctx, env) // commits or rolls back with the insert
//		}
//	}
//
// Derive the id of a follow-up event from the event being handled
// (framework.FollowUpID), as
// above: a handler retried after a rollback adds it again in the new
// transaction, and the same id keeps it one event. Adding an event whose
// source and id the outbox already holds is a no-op.
//
// Add returns ErrNoTx when ctx carries no transaction. Code that runs
// outside a handler (an HTTP endpoint, a command) opens its own
// transaction and passes it to AddTx:
//
//	tx, err := db.BeginTxx(ctx, nil)
//	...
//	if err := box.AddTx(ctx, tx, env); err != nil { ... }
//	err = tx.Commit()
//
// # Relaying
//
// A Relay publishes unsent rows in id order to the topic named by each
// event's type, with the stored CloudEvent as payload, the event id as
// message UUID and the content type in the metadata, the same message
// framework.NewMessage builds. Then it stamps them sent_at. Run it for
// the life of the process (runner.Runner does, given
// runner.Config.OutboxRelay):
//
//	relay, err := outbox.NewRelay(db, transport.Publisher, outbox.RelayConfig{Outbox: box})
//	...
//	go relay.Run(ctx)
//
// With RelayConfig.Outbox set, the commit of an attempt that called Add
// wakes the relay at once (AddTx, whose commit the outbox cannot see, wakes
// it for a few quick polls), instead of at the next poll (PollInterval). Rows sent longer than Retention ago are deleted in
// batches.
//
// How a batch goes out depends on the transport's publisher. The AMQP
// transport's is a DeferredPublisher: the relay publishes the batch's rows
// one after another without waiting for the broker's confirms (publisher
// confirms, pipelined on one channel), marks the confirmed rows sent in one
// statement once the last confirm is in, and reads and publishes the next
// batch meanwhile (two batches on their way at most). A row that the
// broker nacks, or whose confirm is lost with the connection, stays unsent
// and is published again by a later poll; the rows confirmed around it are
// marked. Other publishers (the SQL transports', memory) publish one row at
// a time, each once Publish returned for the one before.
//
// The AMQP transport publishes the rows mandatory: a row whose type's
// exchange has no queue bound comes back from RabbitMQ, which would
// otherwise drop it, and its wait returns driver.ErrUnroutable. Such a row
// stays unsent, and the relay's next batches leave out the rows of its
// type, so that the rows of other types go out; each poll tries the
// oldest of them again, and once a queue is bound they follow. Metrics
// count them by type (effectively_outbox_unroutable_rows) and the relay
// logs a warning at each poll. The types of RelayConfig.DropUnroutable
// are dropped instead: their unroutable rows are marked sent and counted
// (effectively_outbox_unroutable_dropped_total), not as published.
//
// # Tracing
//
// An event carries its creation context in its traceparent and tracestate
// (the CloudEvents distributed-tracing extension). Add and AddTx stamp the
// span of their ctx into each event whose producer set no traceparent: an
// event added by a handler refers to its consumer's span, one added by an
// endpoint to its request's span. With RelayConfig.Tracer, the relay
// publishes each row in a span of its own, "publish" and the event's type,
// of kind producer, a child of the event's creation context (so it shows
// in the producer's trace, whenever the relay gets to it) with the
// OpenTelemetry messaging attributes: messaging.system (the config's
// MessagingSystem), messaging.operation.type send, messaging.operation.name
// publish, messaging.destination.name (the type), messaging.message.id
// (the event id) and cloudevents.event_source. The span ends when the
// transport took the message (with a DeferredPublisher, at its confirm), in
// error when it did not. An event that has no creation context gets the
// publish span's, in the message published (the stored row is left as it
// is), as OpenTelemetry's messaging conventions say. The framework's
// consumers link their spans to the creation context.
//
// # At least once
//
// A relay that stops (or a publisher that fails, or a confirm that is
// lost) after the broker took a message but before its row was marked
// sent publishes the row again later: relaying is at least once, never
// exactly once. That is what the
// framework's consumers absorb: they mark each (consumer, source, id)
// processed in their own transaction, so a republished event is a
// duplicate that they acknowledge and skip. Consumers in other stacks must
// deduplicate on the CloudEvent's source and id too.
//
// Several relays may share one database. On PostgreSQL a batch locks its
// rows with FOR UPDATE SKIP LOCKED until it marks them, so relays do not
// publish the same row. On SQLite a batch takes a lease on its rows
// (claimed_until) in one short write, publishes, then marks them; a relay
// that dies leaves its rows to the next once the lease ends (twice
// RelayConfig.BatchTimeout).
package outbox
