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
// # Partitions
//
// A consumer subscribed with driver.SubscribeConfig.Partitions n above 1
// is read by several processes at once, each reading the partitions it is
// assigned: its subscriber is a driver.Assigner, and reads nothing until
// assigned. A message's partition is its bucket (driver.Bucket of its
// subject, or of its id without one) modulo n. The publisher writes each
// row's bucket in a column of ours, bucket, which the transport adds to
// every messages table; a row inserted without it (by hand, by another
// service's watermill-sql publisher) has its bucket computed from its
// payload by the SQL function effectively_bucket, the same FNV-1a hash.
// Each partition keeps its position in the offsets table, in the row of
// group "<consumer>#<partition>/<n>", under an advisory lock of its own,
// so that a partition has one reader at a time. A process reads all its
// partitions of a topic in one statement on its one connection, through
// the index "<messages table>_bucket_mod_<n>", built (CONCURRENTLY) when
// a consumer of n partitions first subscribes. Assign stops a dropped
// partition once its messages in flight are settled, then writes its
// position and releases its lock, so that the next owner starts there.
// Changing n (every process of the consumer stopped) starts the new
// partitions at the lowest position of the old ones: what lay between is
// delivered again, nothing is lost.
//
// # Concurrency
//
// Two attempts on the same event may run at once (a redelivery while the
// first delivery is still being handled). The second one's mark waits for
// the first transaction: it finds the event processed when the first
// commits, and takes the mark when the first rolls back. Size the pool
// (OpenConfig.MaxOpenConns) for the attempts that run at once.
package postgres
