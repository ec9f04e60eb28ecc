// Package runner runs a whole service without any dependency injection: a
// Runner takes the consumers with their settings, a driver.Transport,
// the database and its store, and the service's settings (the outbox
// relay, the purge, the gauges); it builds each consumer's middleware
// chain and subscription, and between Start and Stop handles their
// messages and runs the service's loops.
//
//	r, err := runner.New(runner.Config{
//		Consumers:   []runner.ConsumerConfig{{Consumer: consumer}},
//		Transport:   transport,
//		DB:          db,
//		Store:       store,
//		OutboxRelay: outbox.RelayConfig{Outbox: box}, // optional
//		Registerer:  registry,                        // optional: the database gauges
//	})
//	...
//	if err := r.Start(ctx); err != nil { ... } // every subscription is ready
//	defer r.Stop(stopCtx)                      // waits for attempts in flight until stopCtx ends
//
// # What runs
//
//   - the consumers, each behind its chain (middleware.Handler), with the
//     chain's sweep of parked events;
//   - the outbox relay, when Config.OutboxRelay has an outbox: it
//     publishes the events that handlers add to the outbox in their
//     transactions (framework/outbox);
//   - the replay relay: it publishes what operators replay (a dead letter
//     resolved as replayed, driver.Store.ResolveDeadLetter) or release
//     from parking, each to its consumer alone (the transport's Replay),
//     so that a dead letter replayed by the command line or the console,
//     in any process, is delivered again;
//   - the purge, every Config.PurgeInterval, of what is past its
//     retention, one process of the service at a time;
//   - the gauges of pending dead letters and parked events, read from the
//     database on scrape, when Config.Registerer is set.
//
// # Start and Stop
//
// Start adopts the processed marks of renamed consumers, binds the
// subscriptions (so nothing published from then on is missed), runs the
// consumers and, once every subscription is ready, starts the relays and
// the purge, then returns. Stop first stops the purge and the replay
// relay (a replay not published yet waits in the database), then closes
// the consumers' intake (new messages are nacked unhandled) and starts no
// further attempt (a message whose attempt failed, or that waits for its
// next one, is nacked at once, neither dead-lettered nor charged a
// delivery), waits for the attempts in flight until its context ends and
// cancels the rest (a canceled attempt rolls back, and its message is
// delivered again later); the outbox relay stops last, after publishing what the
// draining attempts committed. The app package runs a Runner inside an fx
// application, with its settings from the configuration file.
package runner
