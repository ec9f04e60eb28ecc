// Package memory is the in-memory side of the framework, for tests: a
// store of processed marks, delivery counts and dead letters, and the
// memory transport (Transport). Both protect one process only and forget
// everything when the process ends: use framework/sqlite or
// framework/postgres in production.
//
// # Usage
//
// The unit of work runs without a database; the store's marks follow its
// commit and rollback:
//
//	store := memory.NewStore()
//	uow, err := framework.NewUnitOfWork(framework.UnitOfWorkConfig{
//		Processed:  store,
//		Deliveries: store,
//	})
//	if err != nil {
//		return err
//	}
//	outcome, err := uow.Do(ctx, "billing.charge-on-order-placed", key,
//		func(ctx context.Context) error {
//			return charge(ctx, order)
//		})
//
// A second Do of the same consumer and key returns framework.Duplicate
// without calling the function. While one attempt holds a mark, another
// attempt on the same key waits for it to end, as it would on PostgreSQL.
//
// # Dead letters
//
// The store is also a framework.Store: PublishDeadLetter keeps
// one dead letter per consumer and message key, DeadLetters lists them
// and ResolveDeadLetter records an operator's replay or discard.
//
// # Transport
//
// Transport (New) is the framework.Transport on watermill's
// GoChannel with a pause before a nacked message is sent again (GoChannel
// alone sends it again at once). Each Subscribe returns a subscriber of
// its own; every subscription gets every message:
//
//	tr, err := memory.New(memory.PubSubConfig{})
//	if err != nil {
//		return err
//	}
//	defer tr.Close()
//	sub, err := tr.Subscribe(framework.SubscribeConfig{Consumer: "c", Types: []string{topic}})
//	for _, t := range sub.Topics { // the type and the consumer's replay topic
//		router.AddConsumerHandler(name+"@"+t, t, sub.Subscriber, handler)
//	}
package memory
