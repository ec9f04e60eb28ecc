// Package postgres runs the framework on PostgreSQL: Open opens a bounded
// pool with the pgx v5 driver, and Store keeps the processed marks,
// delivery counts and dead letters in the tables that framework/migrate
// creates.
//
// # Usage
//
//	db, err := postgres.Open(ctx, "postgres://app:secret@127.0.0.1:5432/app?sslmode=disable", postgres.OpenConfig{})
//	if err != nil {
//		return err
//	}
//	defer db.Close()
//	if err := migrate.Up(ctx, db, migrate.Config{}); err != nil {
//		return err
//	}
//	store, err := postgres.NewStore(db, postgres.StoreConfig{})
//	if err != nil {
//		return err
//	}
//	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{
//		DB:         db,
//		Processed:  store,
//		Deliveries: store,
//	})
//
// The unit of work and the store share db: the processed mark is written
// in the attempt's transaction, with the handler's writes.
//
// # Transport
//
// Transport (New) is the driver.Transport on watermill-sql v4's tables:
// it publishes with watermill-sql's publisher on the database handed to
// New (the stores' pool may do) and subscribes with a subscriber of its
// own on a pool of its own at TransportConfig.URL, growing by a connection
// per subscription. A consumer has one subscription per event type and one
// for its replay topic, each handing out up to its concurrency of messages
// at once, with no transaction open while they are handled; the group's
// position advances over the messages acknowledged in order. One process
// per group and topic hands out messages (it holds an advisory lock on the
// subscription's connection), the others stand by. The ack deadline
// outlasts the HandlingTime given to Subscribe.
//
//	tr, err := postgres.New(ctx, db, postgres.TransportConfig{URL: url})
//	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "c", Types: []string{topic}})
//
// # Concurrency
//
// Two attempts on the same event may run at once (a redelivery while the
// first delivery is still being handled). The second one's mark waits for
// the first transaction: it finds the event processed when the first
// commits, and takes the mark when the first rolls back. Size the pool
// (OpenConfig.MaxOpenConns) for the attempts that run at once.
package postgres
