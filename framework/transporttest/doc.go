// Package transporttest is the one integration suite every transport runs:
// the framework's whole consumer chain (middleware.Handler) behind
// watermill's router, on a real transport and a real database, the way the
// application wires them. Each transport's tiny test supplies an Env and
// calls Exercise, the way River runs one driver suite against each driver:
//
//	func TestTransport(t *testing.T) {
//		t.Parallel()
//		transporttest.Exercise(t, func(t *testing.T) *transporttest.Env {
//			return &transporttest.Env{ /* publisher, subscribers, database */ }
//		})
//	}
//
// The cases: delivery of distinct events, concurrent duplicates across two
// processes of one consumer with concurrency 8 (one effect per event),
// retries, dead letters (permanent errors and poison), replay to one
// consumer, a consumer restarted mid-stream, several event types on one
// consumer, and, when the Env can publish as a plain client (PublishRaw),
// interoperability. ExerciseServerRestart restarts the server under a
// consumer draining a backlog, for transports whose tests run a server of
// their own.
//
// Each case uses event types and consumer names of its own, so that cases
// run in parallel on one server without seeing each other's messages.
package transporttest
