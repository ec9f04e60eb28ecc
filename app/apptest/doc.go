// Package apptest tests a service the way it runs in production: its own
// fx module (the consumers it declares with handlers.Register and
// handlers.On, the constructors of its handlers and their dependencies,
// its app.Middleware and app.Migrations) inside the framework's
// application (app.New), with the application's *outbox.Outbox and relay,
// on a real database and a real transport. Where app/testkit puts
// one handler behind the consumer chain, apptest exercises the wiring: a
// handler whose constructor needs something the module does not provide
// fails the test's start, as it would fail the service's.
//
// # A typical test
//
// New starts the module on a fresh SQLite file, migrated with the
// framework's tables and the module's migrations, with the sqlite
// transport and no HTTP server, and stops it when the test ends. Publish
// sends an event to its type's topic, as a producer would, and returns
// what became of it at each consumer of the type, as the consumer's chain
// reported it (a testkit.Result; check it with testkit's Require
// helpers). This is TestModule in examples/notifications, run on SQLite
// and PostgreSQL:
//
//	func testReminders(t *testing.T, postgresURL string) {
//		ctx := t.Context()
//		svc := apptest.New(t, Module, apptest.Config{PostgresURL: postgresURL}) // SQLite when empty
//
//		env := testkit.Envelope(t, appointments.Booked, appointments.BookedV1{
//			AppointmentID: "appt-1",
//			StartsAt:      time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC),
//		}, framework.Attributes{Source: appointments.Source})
//		for _, want := range []framework.Outcome{framework.Processed, framework.Duplicate} { // delivered twice
//			res, err := svc.Publish(ctx, env)
//			require.NoError(t, err)
//			testkit.RequireOutcome(t, res[ConsumerName], want)
//		}
//		var n int
//		require.NoError(t, svc.DB().GetContext(ctx, &n, svc.DB().Rebind(`SELECT count(*) FROM reminders WHERE event_id = ?`), env.ID))
//		require.Equal(t, 1, n, "one reminder, however often the event is delivered")
//
//		poison := []byte(`{"specversion":"1.0","id":"p-1","source":"appointments","type":"appointments.appointment.booked","eventversion":1,"data":{"appointmentId":"appt-2"}}`)
//		res, err := svc.PublishBody(ctx, appointments.Booked.Type(), poison)
//		require.NoError(t, err)
//		testkit.RequireDeadLettered(t, res[ConsumerName], framework.CodeInvalidPayload) // startsAt is required
//
//		dls, err := svc.Store().DeadLetters(ctx, driver.DeadLetterFilter{Consumer: ConsumerName})
//		require.NoError(t, err)
//		require.Len(t, dls, 1)
//		require.Equal(t, "p-1", dls[0].EventID)
//		require.Equal(t, appointments.Booked.Type(), dls[0].Topic)
//	}
//
// The package's Example runs a module the same way outside a test, with
// Start and Close.
//
// # Sending and waiting
//
//   - Publish and PublishBody send to a type's topic and wait for every
//     consumer of the module that handles it; each call is a new message,
//     so publishing an event twice shows the second copy as a duplicate.
//   - Deliver and DeliverBody send to one consumer alone, the way an
//     operator's replay reaches it (its replay topic).
//   - Await waits for the outcome of a message the test did not send: an
//     event a handler added to the outbox, which the relay publishes after
//     the commit, or the redelivery of a message that was nacked.
//
// Each wait ends with the outcome (processed, duplicate, stale,
// dead-lettered with its code, or nacked), or with an error after
// Config.OutcomeTimeout (a minute), so that a test fails instead of
// hanging.
//
// # Configuration
//
// The application's configuration is the kit's, never the environment's:
// auto-migrate on, HTTP off, the consumers' retries fast (testkit's
// defaults: 3 attempts 1ms apart, 10s per attempt) unless Config.Defaults
// or Config.Consumers say otherwise. Config.Transport chooses the sqlite
// transport (the default, which acknowledges in the handler's
// transaction) or the memory one. With Config.PostgresURL the stores go
// to a schema of the test's own on that server, dropped on Close, and the
// sqlite transport to a file of its own; write the handler's and the
// test's SQL with "?" and Rebind. The application's logs are discarded
// unless Config.Logger takes them (the kit supplies the *slog.Logger, so
// the module must not).
//
// # Crashes
//
// Config.Crash is a crash hook (testkit.CrashHook) that the application
// puts on every message it handles: a delivery it makes die at a crash
// point is reported testkit.Crashed, as if its process died there, and
// the transport delivers the message again; Await returns that
// redelivery's outcome. testkit.CrashOnce(testkit.BeforeCommit) makes the
// first delivery die before its commit, and no other: the redelivery is
// processed. After a death past the commit it is a duplicate, unless the
// ack joined the committed transaction (the sqlite transport in the
// stores' file), and the message is not delivered again. TestModuleCrash
// in examples/notifications does both; docs/testing.md shows it.
//
// # Limits
//
// The kit runs neither RabbitMQ nor the postgres transport: the
// transports have their own conformance suite (framework/driver/transporttest),
// and examples/notifications runs its demo on each. Outcomes are matched
// to consumers by the router handler's name, which the application
// derives from the consumer's name.
package apptest
