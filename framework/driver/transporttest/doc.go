// Package transporttest is the conformance suite of driver.Transport:
// what a transport must do by itself, exercised through the interface with
// plain watermill handlers behind watermill's router, and no consumer
// chain. Each transport's tiny test builds its driver.Transport with
// its package's New, supplies it in an Env with the hooks to publish as a
// plain client, and calls Exercise, the way River runs one driver suite
// against each driver:
//
//	func TestTransport(t *testing.T) {
//		t.Parallel()
//		transporttest.Exercise(t, func(t *testing.T) *transporttest.Env {
//			tr, err := sqlite.New(db, sqlite.TransportConfig{})
//			require.NoError(t, err)
//			return &transporttest.Env{Transport: tr, PublishRaw: ...}
//		})
//	}
//
// The suite subscribes each consumer through Transport.Subscribe, binds
// the Subscription (Initialize) and runs a router handler per topic. The
// cases: a subscription of two types receives every message published to
// either, with its payload and metadata intact; a nacked message is
// delivered again; Initialize keeps the messages published before the
// subscriber's first Subscribe; Replay reaches the named consumer only;
// Ready reports a transport that can deliver; Close closes what the
// transport built (the subscriber's channels end, the publisher refuses);
// a body published by a plain client (Env.PublishRaw) arrives intact;
// every delivered message tells when it was published
// (framework.MetadataPublishedAt), never with a producer's value of it.
//
// The bad-input catalog (Catalog) runs on every transport too: each input
// the Env can carry reaches the subscriber with its body intact, its
// metadata intact or, where the transport cannot hold it, with NUL and
// bytes that are not UTF-8 replaced, and marked unreadable
// (framework.MetadataUnreadable) exactly when its stored metadata cannot
// be read; none stalls the subscription. Inputs with stored metadata need
// Env.PublishRow, those with typed headers Env.PublishHeaders; a
// transport without them skips those inputs. A transport that stores
// JSON (Env.StoresJSON) may refuse at publish what is not JSON text.
//
// ExerciseServerRestart restarts the server under a subscriber draining a
// backlog, for transports whose tests run a server of their own: every
// message arrives intact.
//
// What the consumer chain does behind a transport (exactly once, retries,
// dead letters with their codes, hold-ups) is app/runner/runnertest's
// suite, which app/runner's tests run on every transport. This package
// imports neither the middleware nor the app.
//
// Each case uses topics and consumer names of its own, so that cases run
// in parallel on one server without seeing each other's messages.
package transporttest
