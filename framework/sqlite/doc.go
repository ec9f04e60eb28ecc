// Package sqlite runs the framework on one SQLite file, with no server:
// the embedded default. It holds three things that share the file.
//
// # Opening the file
//
// Open opens it the way the framework needs: write-ahead logging, a busy
// timeout, and transactions that take the write lock when they begin, so
// that writers queue instead of failing. The folder is created when
// missing.
//
//	db, err := sqlite.Open(ctx, "file:./data/effectively.db", sqlite.OpenConfig{})
//
// # The stores
//
// Store keeps processed marks, delivery counts and dead letters in the
// tables that package migrate creates. Times are INTEGER nanoseconds since
// the Unix epoch, in UTC.
//
// # The Pub/Sub
//
// Transport (New) is the driver.Transport on one file: a Publisher,
// and a Subscriber per consumer (Subscribe) holding the consumer's
// concurrency in flight, with a lease of twice its attempt timeout.
// Publisher and Subscriber, which also stand alone, implement watermill's
// interfaces over the same file, lease-based: a subscription claims messages for its consumer group
// in short transactions, hands them out, and acknowledges them in batches;
// no transaction stays open while a handler runs, so the handler's own
// transaction can take the write lock. When the framework's stores share
// the file, the ack joins the handler's transaction:
// the effect and the ack commit together. A Notifier shared by publishers
// and subscribers of one process wakes subscriptions at once; a message
// another process inserts is seen by a watch of the newest offset, one
// per Notifier and db (every 20ms by default); leases that expired and
// nacks whose delay passed are found by polling.
//
// SQLite has one writer per file. The write transactions of one process
// queue for it in Go, first come first served (Open puts a write gate in
// front of the driver), rather than in SQLite's busy handler, which sleeps,
// retries and lets a writer lose again and again: with 16 messages in
// flight this took the transport with a handler transaction from about
// 1,500 to 2,100 messages per second here. Attempts serialise per file, so
// a message may wait long behind the others in flight: a subscription
// renews the leases of the messages it holds every third of
// LeaseDuration, and a lease only has to outlast a renewal's wait for the
// write lock; the messages of a process that died come back within about
// one LeaseDuration. The busy timeout must outlast the longest attempt.
// The message format, for other
// programs that publish by hand, and the measured limits are in
// docs/transports.md.
package sqlite
