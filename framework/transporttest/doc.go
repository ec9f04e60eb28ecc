// Package transporttest is the one integration suite every transport runs:
// the framework's whole consumer chain (middleware.Handler) behind
// watermill's router, on a real transport and a real database, the way the
// application wires them. Each transport's tiny test builds its
// framework.Transport with its package's New, supplies it in an Env with
// the database and the hooks to publish as a plain client, and calls
// Exercise, the way River runs one driver suite against each driver:
//
//	func TestTransport(t *testing.T) {
//		t.Parallel()
//		transporttest.Exercise(t, func(t *testing.T) *transporttest.Env {
//			tr, err := sqlite.New(db, sqlite.TransportConfig{})
//			require.NoError(t, err)
//			return &transporttest.Env{DB: db, Store: store, Transport: tr}
//		})
//	}
//
// The suite publishes and replays through the Transport, and subscribes
// each consumer process it starts through Transport.Subscribe, binding
// the Subscription (Initialize) before it runs a router handler per topic.
//
// The cases: delivery of distinct events, concurrent duplicates across two
// processes of one consumer with concurrency 8 (one effect per event),
// retries, dead letters (permanent errors and poison), replay to one
// consumer, a consumer restarted mid-stream, several event types on one
// consumer, when the Env can publish as a plain client (PublishRaw),
// interoperability, and the hold-up of a bad message at the head of the
// line: one that fails on every attempt is dead-lettered once its attempts
// ran out, one that kills its process on every delivery once it reached
// the delivery limit, and the events behind it each take effect once.
//
// The bad-input catalog (Catalog) runs on every transport too: each input
// that must not stop a consumer ends as a dead letter with its code, or
// takes effect, and the valid events published around each take effect
// exactly once. Inputs with stored metadata need Env.PublishRow, those
// with typed headers Env.PublishHeaders; a transport without them skips
// those inputs.
//
// ExerciseServerRestart restarts the server under a consumer draining a
// backlog, for transports whose tests run a server of their own.
//
// Each case uses event types and consumer names of its own, so that cases
// run in parallel on one server without seeing each other's messages.
package transporttest
