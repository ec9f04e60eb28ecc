package console

import "time"

// Partitions are a partitioned consumer's partitions, as the consumers
// view shows them.
type Partitions struct {
	// Count is the number of partitions the consumer runs with.
	Count int
	// Configured is the consumer's partitions setting: while it differs
	// from Count, the service refuses to start the consumer.
	Configured int
	// Members are the consumer's live processes.
	Members []string
	// Rows are the partitions, 0 to Count-1.
	Rows []Partition
	// BacklogError says why the messages waiting are unknown; empty when
	// they are known.
	BacklogError string
}

// Partition is one partition of a consumer: its lease and what waits in
// it.
type Partition struct {
	Partition int
	// Owner is the live process holding the partition's lease; empty
	// when it is free or expired.
	Owner string
	// Token is the lease's fencing token.
	Token int64
	// ExpiresIn is how long the owner's lease lasts unless renewed.
	ExpiresIn time.Duration
	// Waiting is how many messages wait in the partition, as text: a
	// count, "N+" past the transport's cap, "?" when unknown.
	Waiting string
	// Position is the partition's position in each topic ("topic@offset",
	// the replay topic named "replay"), "-" when the transport keeps
	// none.
	Position string
}

// Lag is what waits for a consumer, all its partitions together, as the
// consumers view shows it.
type Lag struct {
	// Waiting is how many messages wait, as text: a count, "N+" past the
	// transport's cap, "?" when unknown.
	Waiting string
	// Oldest is the age of the oldest message not yet handled, as text;
	// "-" when none waits, "?" when the transport cannot tell (amqp).
	Oldest string
	// Error says why the transport could not count; empty when it did.
	Error string
}
