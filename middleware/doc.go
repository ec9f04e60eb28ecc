// Package middleware holds the steps of a consumer's chain, one file each,
// as watermill middleware. Handler assembles them in the order of the
// design, outermost first:
//
//	Observe        logs, metrics, a consumer span linked to the producer
//	DeadLetter     stores poison and exhausted messages, then acks; never on shutdown
//	Decode         CloudEvent, route and data validation; poison is permanent
//	GapWait        optional: an event waiting for an earlier one is nacked, or after a while sequence_gap
//	DeliveryGuard  durable delivery count; over the limit: delivery_limit; redeliveries one at a time
//	[Outer]        the application's middleware, once per delivery, with the decoded event
//	Retry          constant delay, bounded attempts; permanent errors skip it
//	Timeout        a deadline per attempt
//	Recover        a panic becomes an error with code panic
//	UnitOfWork     one transaction with the processed mark (framework.UnitOfWork)
//	SequenceGuard  optional: skips an event older than its subject's checkpoint
//	StrictOrder    or: applies a subject's events in sequence, an event ahead of its turn waits
//	[Inner]        the application's middleware inside the transaction
//	Dispatch       the handler
//
// The router acknowledges a message when Handler returns nil: after its
// effect committed, when it was a duplicate, or once it was stored as a
// dead letter. Anything else, a shutdown included, nacks it and it is
// delivered again.
//
//	h, err := middleware.Handler(middleware.ChainConfig{
//		Consumer:    consumer,
//		UnitOfWork:  uow,
//		DeadLetters: store,
//		Deliveries:  store,
//		Retry:       middleware.RetryConfig{Attempts: 5, Delay: 2 * time.Second},
//	})
//	router.AddConsumerHandler(consumer.Name()+"@"+typ, typ, subscriber, h)
//
// Package app does this for every registered consumer.
//
// # Application middleware
//
// ChainConfig.Outer runs once per delivery, outside the retries and the
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
// limit, until delivery_limit. ChainConfig.Inner runs inside each attempt,
// in its transaction (framework.TxFromContext), for the deliveries that
// are not duplicates. Package app takes both as app.Middleware; its
// ExampleMiddleware runs them in the application on SQLite.
package middleware
