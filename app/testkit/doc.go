// Package testkit tests a handler the way production runs it: through the
// framework's whole consumer chain (middleware.Handler: decode, delivery
// guard, retries, time limit, unit of work with the processed mark, dead
// letters) on a real database, in a few lines per test.
//
// # A typical test
//
// New gives the test a fresh SQLite file in t.TempDir(), migrated with the
// framework's tables and the application's own migrations. Chain puts
// the handler behind the chain; Deliver hands it a message as a transport
// would and returns what became of it, as the chain itself reports it:
//
//	func TestRemindOnBooked(t *testing.T) {
//		t.Parallel()
//		ctx := t.Context()
//		kit := testkit.New(t, testkit.Config{Migrations: migrations})
//		h := &Reminders{db: kit.DB()}
//		c := kit.Chain(t, "notifications.remind-on-appointment-booked",
//			framework.Handle(Booked, h.Handle))
//
//		env := testkit.Envelope(t, Booked, BookedV1{AppointmentID: "a-1"}, framework.Attributes{})
//		testkit.RequireProcessed(t, c.Deliver(ctx, t, env))
//		testkit.RequireDuplicate(t, c.Deliver(ctx, t, env)) // the broker delivered it twice
//		// ... one row in reminders, through kit.DB()
//
//		res := c.DeliverBody(ctx, t, []byte("not an event"))
//		testkit.RequireDeadLettered(t, res, framework.CodeMalformedEnvelope)
//	}
//
// The handler writes through framework.Conn(ctx, db), so its writes commit
// with the processed mark; a test that counts its rows after two
// deliveries proves it does. TestShowcase in this package's tests is this
// test, compiled and run on SQLite and PostgreSQL; the package's Example
// runs the kit outside a test.
//
// # What a delivery can become
//
// A Result holds the framework.Outcome (Processed, Duplicate, Stale,
// DeadLettered or Nacked), the dead letter's Code, the number of Attempts
// and, when nacked, the error the transport would see. RequireProcessed,
// RequireDuplicate, RequireStale, RequireNacked and RequireDeadLettered
// check it and fail the test with the whole result when it differs.
//
//   - A plain error from the handler is retried Config.Attempts times,
//     Config.RetryDelay apart (3 times, 1ms apart by default), then the
//     message is dead-lettered with retries_exhausted.
//   - framework.Permanent(code, err) dead-letters at once with code.
//   - A panic is retried, then dead-lettered with panic; an attempt over
//     Config.Timeout with timeout.
//   - Poison (DeliverBody, or an envelope whose data does not validate)
//     is dead-lettered without an attempt.
//   - An attempt whose context ends (cancel the ctx given to Deliver, as a
//     shutdown does) rolls back and is Nacked, never dead-lettered.
//     Config.MaxDeliveries such deliveries later, the next one is
//     dead-lettered with delivery_limit.
//
// DeliverConcurrently delivers one event n times at once, a duplicate
// storm: exactly one result is Processed. DeliverMessage delivers a
// message with metadata of the test's choice. Replay marks a dead letter
// replayed and delivers it again, as the operator's command does, for a
// test of the fix. Kit.DeadLetters and Chain.DeadLetters list what was
// dead-lettered, with its code and attempts, never the error's text.
//
// # Crashes
//
// DeliverCrashing makes a delivery die at a named step of the pipeline
// (a CrashPoint: AfterDecode, AfterCount, AfterMark, BeforeCommit,
// AfterCommit, BeforeDeadLetter, BeforeAck) as if its process died
// there: its transaction rolls back without running its hooks, nothing is
// acknowledged, and the Result is Crashed. Redeliver delivers the message
// again, marked as a redelivery, for the test to check one effect: a
// delivery that died before the commit is processed again, one that died
// after it is a duplicate.
//
//	res := c.DeliverCrashing(ctx, t, env, testkit.BeforeCommit)
//	testkit.RequireCrashed(t, res, testkit.BeforeCommit)
//	testkit.RequireProcessed(t, c.Redeliver(ctx, t, env))
//
// Under group commit a death kills every delivery of its batch:
// WithCrashHook puts a hook of the test's own on the deliveries' context
// (one event of several dies), DeliverTogether delivers them at once, and
// Config.BatchSize with Config.BatchLinger makes them share a batch.
// docs/testing.md shows each case, from this package's crash examples.
//
// # PostgreSQL
//
// With Config.PostgresURL set, the kit creates a schema of the test's own
// on that server, connects to it (search_path), and drops it when the
// test ends, so tests run in parallel on one database. One test then runs
// on both databases:
//
//	kit := testkit.New(t, testkit.Config{
//		PostgresURL: os.Getenv("EFFECTIVELY_TEST_POSTGRES_URL"), // SQLite when empty
//		Migrations:  migrations,
//	})
//
// Write the handler's and the test's SQL with "?" placeholders and
// kit.DB().Rebind.
//
// # The service's own module
//
// The kit registers handlers with framework.Handle and takes no
// middleware: it tests a handler, not the service's wiring. To run the
// service's own fx module (its handlers.On registrations, the
// dependencies fx gives its handlers such as *outbox.Outbox, its
// app.Middleware) in the real application on a real database and
// transport, use package app/apptest, which reports outcomes as this
// package's Result.
//
// # Limits
//
// There is no transport: messages go straight into the chain, so a dead
// letter's Topic is empty and no redelivered flag is set but by
// Redeliver (the delivery guard counts every delivery, as on
// watermill-sql). The transports have their own conformance suite
// (framework/driver/transporttest).
package testkit
