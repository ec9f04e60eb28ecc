// Package runnertest is the integration suite of the consumer chain behind
// a real transport: it runs consumers through runner.New, on a
// driver.Transport and a real database, the way the application does,
// and checks what the chain promises there. app/runner's tests run it on
// every transport, the way River runs one driver suite against each
// driver:
//
//	func TestSQLite(t *testing.T) {
//		t.Parallel()
//		runnertest.Exercise(t, runnertest.Has{Order: true}, func(t *testing.T) *runnertest.Env {
//			tr, err := sqlite.New(db, sqlite.TransportConfig{})
//			require.NoError(t, err)
//			return &runnertest.Env{DB: db, Store: store, Env: transporttest.Env{Transport: tr, PublishRaw: ...}}
//		})
//	}
//
// Each process the suite starts is a Runner of one consumer on the Env's
// Transport (or a transport of its own, Env.Process); stopping it cancels
// the attempts in flight, as a process that dies would. Per-message
// behaviour goes through runner.Config's Outer and Inner middleware.
//
// The cases: delivery of distinct events, concurrent duplicates across two
// processes of one consumer with concurrency 8 (one effect per event),
// retries, dead letters (permanent errors and poison), replay to one
// consumer, a consumer restarted mid-stream, several event types on one
// consumer, interoperability with a plain client (Env.PublishRaw), and the
// hold-up of a bad message at the head of the line: one that fails on
// every attempt is dead-lettered once its attempts ran out, one that kills
// its process on every delivery once it reached the delivery limit, and
// the events behind it each take effect once; and a stop during an outage,
// which starts no further attempt: the event in flight is nacked after the
// attempt that ran, never dead-lettered, and handled once afterwards.
//
// The bad-input catalog (transporttest.Catalog) runs on every transport
// too: each input that must not stop a consumer ends as a dead letter with
// its code, or takes effect, and the valid events published around each
// take effect exactly once. Inputs with stored metadata need
// Env.PublishRow, those with typed headers Env.PublishHeaders; a transport
// without them skips those inputs.
//
// ExerciseServerRestart restarts the server under a Runner draining a
// backlog and checks that every event took effect exactly once.
//
// What a transport must do by itself, without the chain, is
// framework/driver/transporttest's suite, which each transport's package runs.
//
// Each case uses event types and consumer names of its own, so that cases
// run in parallel on one server without seeing each other's messages.
package runnertest
