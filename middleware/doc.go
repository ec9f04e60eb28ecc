// Package middleware is a consumer's chain of steps, as one watermill
// handler: Handler builds it from one Config. The steps share what they
// learn about a message through its context, so they come only as the
// whole chain, in this order, outermost first (one file each):
//
//	releaseParked  with StrictOrder: after the message, applies the parked events that it let through; its sweep (also while no message comes, see Handler), those left and those that waited too long
//	observe        logs, metrics, a consumer span linked to the producer
//	deadLetter     stores poison and exhausted messages, then acks; never on shutdown; with StrictOrder the dead letter holds its subject
//	decode         CloudEvent, route and data validation; poison is permanent
//	breaker gate   with Breaker: while the breaker is open a message waits here, uncounted, up to MaxHold
//	gapWait        with StrictOrder: an event waiting for an earlier one is nacked, parked after GapPark, or after GapTimeout sequence_gap
//	deliveryGuard  durable delivery count; over MaxDeliveries: delivery_limit; redeliveries one at a time
//	rateLimit      with RateLimit: at most so many messages per second, in this process
//	[Outer]        the application's middleware, once per delivery, with the decoded event
//	retry          constant delay, bounded attempts; permanent errors skip it; none once Config.Stopping closed
//	breaker count  with Breaker: each attempt's success or failure; a dependency failure while open ends the attempts, nacked
//	timeout        a deadline per attempt
//	recoverPanic   a panic becomes an error with code panic
//	unitOfWork     one transaction with the processed mark (driver.UnitOfWork)
//	sequenceGuard  with SkipStale: skips an event older than its subject's checkpoint
//	strictOrder    or with StrictOrder: applies a subject's events in sequence, an event ahead of its turn waits, or is parked behind a dead letter
//	[Inner]        the application's middleware inside the transaction
//	dispatch       the handler
//
// The router acknowledges a message when the handler returns nil: after
// its effect committed, when it was a duplicate or stale, or once it was
// stored as a dead letter. Anything else, a shutdown included, nacks it
// and it is delivered again.
//
//	h, sweep, err := middleware.Handler(middleware.Config{
//		Consumer:   consumer,
//		UnitOfWork: uow,
//		Store:      store,
//		Settings:   middleware.Settings{Attempts: 5, RetryDelay: 2 * time.Second},
//	})
//	router.AddConsumerHandler(consumer.Name()+"@"+typ, typ, subscriber, h)
//	go sweep(ctx) // the parked events' work no message drives; wait for it before closing the store
//
// Package app/runner does this for every consumer it runs. On a
// sqlite.Subscriber it also sets Config.Acker to the subscriber, so that
// each message's ack commits with its effect; a router of your own does
// the same (without it the message is acked once its chain returns).
//
// The rate limit is per process and per consumer: each process that runs
// the consumer hands at most RateLimit of its messages per second to the
// steps after deliveryGuard, so n processes handle up to n × RateLimit.
//
// # Application middleware
//
// Config.Outer runs once per delivery, outside the retries and the
// transaction, with the decoded event in the message context:
//
//	func tenantCheck(next message.HandlerFunc) message.HandlerFunc {
//		return func(msg *message.Message) ([]*message.Message, error) {
//			d, _ := framework.EnvelopeFromContext(msg.Context())
//			if !knownTenant(d.Source) {
//				return nil, framework.Permanent("unknown_tenant", nil) // dead-lettered, acked
//			}
//			return next(msg)
//		}
//	}
//
// Its permanent errors are dead-lettered with their code; its other errors
// nack the message, which comes back and counts towards the delivery
// limit, until delivery_limit. Config.Inner runs inside each attempt,
// in its transaction (driver.TxFromContext), for the deliveries that
// are not duplicates. Package app takes both as app.Middleware; its
// ExampleMiddleware runs them in the application on SQLite;
// docs/middleware.md says what each place sees and guarantees.
//
// # Observing
//
// Metrics (NewMetrics) counts every consumer's outcomes, dead-letter
// codes, attempts and durations, and keeps each consumer's failing
// messages (Metrics.Consumers, as ConsumerStatus). ReportOf reads back
// what became of one message.
package middleware
