// Package memory is the in-memory side of the framework, for tests: a
// driver.Store of processed marks, delivery counts, subject
// checkpoints, parked events and dead letters (Store), and the memory transport (Transport). Both
// protect one process only and forget everything when the process ends:
// use framework/sqlite or framework/postgres in production.
//
// # Usage
//
// The unit of work runs without a database; the store's marks follow its
// commit and rollback:
//
//	store, err := memory.NewStore(memory.StoreConfig{})
//	if err != nil {
//		return err
//	}
//	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{Store: store})
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
// Likewise, Checkpoint and Advance hold a subject for the attempt until
// its transaction ends, and an advance takes effect when it commits.
//
// StoreConfig.Now is the store's clock: it stamps the marks that
// PurgeProcessed deletes by age and the waits that WaitGap measures.
//
// # Dead letters
//
// PublishDeadLetter keeps one dead letter per consumer and message key,
// with a history of its failures and resolutions (DeadLetterHistory);
// DeadLetters lists them and ResolveDeadLetter records an operator's
// replay or discard, a replay as a Replay that ClaimReplays hands to the
// replay relay.
//
// # Transport
//
// Transport (New) is the driver.Transport on watermill's
// GoChannel with a pause before a nacked message is sent again (GoChannel
// alone sends it again at once). Each Subscribe returns a subscriber of
// its own; every subscription gets every message:
//
//	tr, err := memory.New(memory.TransportConfig{})
//	if err != nil {
//		return err
//	}
//	defer tr.Close()
//	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "c", Types: []string{topic}})
//	for _, t := range sub.Topics { // the type and the consumer's replay topic
//		router.AddConsumerHandler(name+"@"+t, t, sub.Subscriber, handler)
//	}
package memory
