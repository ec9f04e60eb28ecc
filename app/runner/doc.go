// Package runner runs consumers without any dependency injection: a
// Runner takes the consumers with their settings, a framework.Transport,
// the database and its store, builds each consumer's middleware chain and
// subscription, and handles their messages between Start and Stop.
//
//	r, err := runner.New(runner.Config{
//		Consumers: []runner.ConsumerConfig{{Consumer: consumer}},
//		Transport: transport,
//		DB:        db,
//		Store:     store,
//	})
//	...
//	if err := r.Start(ctx); err != nil { ... } // every subscription is ready
//	defer r.Stop(stopCtx)                      // waits for attempts in flight until stopCtx ends
//
// Start adopts the processed marks of renamed consumers, binds the
// subscriptions (so nothing published from then on is missed) and
// returns once every subscription is ready. Stop closes the intake (new
// messages are nacked unhandled) and starts no further attempt (a message
// whose attempt failed, or that waits for its next one, is nacked at
// once, neither dead-lettered nor charged a delivery), waits for the
// attempts in flight until its context ends, then cancels the rest: a
// canceled attempt rolls back, and its message is delivered again later. The app package runs a
// Runner inside an fx application.
//
// A Runner handles messages only: the application around it also runs the
// outbox relay (framework/outbox.Relay), the purge of old processed
// marks, and the replay relay that publishes what operators replay or
// release (the store's replays, see framework.Store.ClaimReplays: each
// published with the transport's Replay to its consumer alone, then
// ReplaySent). A service built on a Runner alone runs those itself, or
// its dead-letter replays are recorded but never delivered.
package runner
