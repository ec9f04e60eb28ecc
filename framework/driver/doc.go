// Package driver is the contract between effectively and the stores and
// transports it runs on: what an implementer of a store or a transport
// needs, and what the project's own packages (the consumer chain, the
// runner, the app) drive them with. A handler author needs none of it:
// package framework holds the author's API, and framework.Conn joins the
// attempt's transaction.
//
// # Stores
//
// A Store keeps, in the service's database, what makes an effect happen
// once: the processed marks, written in the attempt's transaction (a
// *Tx), the delivery counts, the subjects' checkpoints, the events parked
// under strict order, the dead letters with their history, and the
// replays an operator asked for. A store may also implement Inspector
// (the operator's views of one event and of the consumers), Purger (the
// purge past retention, under a lease) and Gauges (the figures every
// process exports alike). sqlite.Store, postgres.Store and memory.Store
// implement them.
//
// A new store proves itself with the conformance suite of package
// storetest, which runs the same cases against every store, mostly
// through a UnitOfWork:
//
//	func TestStore(t *testing.T) {
//		storetest.Exercise(t, func(t *testing.T) storetest.Harness {
//			db := openTestDB(t)
//			return storetest.Harness{DB: db, NewStore: func(t *testing.T, cfg storetest.Config) driver.Store {
//				return newStore(t, db, cfg)
//			}}
//		})
//	}
//
// A store whose marks cannot join the database's transaction declares it
// with a method MarkScope() MarkScope (see MarkScope): NewUnitOfWork
// refuses one whose marks outlive a rollback.
//
// # Transports
//
// A Transport publishes events to their type's topic, subscribes each
// consumer (Subscribe, with a SubscribeConfig, returning a Subscription
// that a router runs) and replays messages to one consumer alone. The
// sqlite, postgres, amqp and memory packages implement it; the suite of
// package transporttest holds each to the same behaviour:
//
//	transporttest.Exercise(t, func(t *testing.T) *transporttest.Env {
//		tr, err := mytransport.New(cfg)
//		require.NoError(t, err)
//		return &transporttest.Env{Transport: tr}
//	})
//
// # The unit of work
//
// UnitOfWork.Do runs one attempt: in a transaction, it marks the event
// processed through the Store and runs the handler, whose writes commit
// with the mark or roll back with it; under group commit several attempts
// share one transaction (UnitOfWorkConfig.BatchSize). The attempt's
// context carries its Tx (TxFromContext), whose OnCommit and OnRollback
// hooks run once the effect committed or rolled back. Consume runs one
// message body through a consumer in a unit of work, without retries or
// dead letters: the consumer chain of package middleware adds those.
package driver
