package driver

import (
	"context"
	"time"
)

// BacklogCap is the most messages a BacklogCounter counts in one
// partition: past it, the count stops and says so (PartitionBacklog.More),
// so that a deep backlog costs no more than this to count.
const BacklogCap = 100_000

// BacklogCounter is implemented by a Transport that can tell what waits
// for a consumer in each of its partitions: the operator's views and the
// metrics read it, and the repartition command refuses while anything
// waits. The PostgreSQL and RabbitMQ transports implement it.
type BacklogCounter interface {
	// Backlogs returns, for each of the partitions of consumer (one,
	// partition 0, when partitions is 1 or less: the consumer is not
	// partitioned), what waits in it, by partition. types are the event
	// types the consumer receives: the transport counts in their topics
	// and in the consumer's replay topic where it keeps them apart. A
	// partition the transport has no trace of yet (the consumer never
	// subscribed with that many partitions) has nothing waiting.
	//
	// It reads the transport's state and changes nothing. Its cost is
	// the transport's to say; it is meant for an operator's command or a
	// scrape, not for a message's path.
	Backlogs(ctx context.Context, consumer string, types []string, partitions int) ([]PartitionBacklog, error)
}

// PartitionBacklog is what waits for a consumer in one of its partitions,
// as a BacklogCounter counts it.
type PartitionBacklog struct {
	Partition int
	// Waiting is how many messages of the partition the consumer has not
	// acknowledged yet, at most BacklogCap: on PostgreSQL, the rows after
	// the partition's position, those handed out and not yet
	// acknowledged in order included; on RabbitMQ, the messages ready in
	// the partition's queue, not those delivered and unacknowledged.
	Waiting int64
	// More says that the count stopped at BacklogCap: at least Waiting
	// messages wait.
	More bool
	// Oldest is the age of the oldest message waiting in the partition,
	// by the database's clock (PostgreSQL, SQLite: now less its
	// created_at); 0 when none waits, or when OldestKnown is false.
	Oldest time.Duration
	// OldestKnown says that the transport can tell Oldest: false on
	// RabbitMQ, whose queues tell no message's age without the
	// management plugin.
	OldestKnown bool
	// Topics are the partition's positions, one per topic, where the
	// transport keeps one (PostgreSQL); none on RabbitMQ, whose queues
	// keep no position.
	Topics []TopicBacklog
}

// TopicBacklog is what waits for a consumer's partition in one topic,
// where the transport keeps a position per topic (PostgreSQL: a row of
// the topic's offsets table per partition).
type TopicBacklog struct {
	Topic string
	// Position is the offset of the last message acknowledged in order
	// (PostgreSQL: the offset_acked of the partition's row, a message's
	// "offset" column); 0 before the first. Known is false when the
	// transport holds no position of the partition in the topic yet.
	Position int64
	Known    bool
	// Waiting is how many messages of the partition wait in the topic,
	// after Position, at most BacklogCap; More says the count stopped
	// there.
	Waiting int64
	More    bool
	// Oldest is the age of the oldest message of the partition waiting
	// in the topic; 0 when none waits.
	Oldest time.Duration
}

// InFlightAger is implemented by a BacklogCounter whose Backlogs cannot
// tell the age of the messages waiting (PartitionBacklog.OldestKnown is
// false: RabbitMQ without its management plugin). AgesInFlight returns
// true: each process then reports, as a consumer's oldest message, the
// oldest one handed to it and not yet finished, aged from when it was
// published (framework.MetadataPublishedAt), else from its hand-over.
type InFlightAger interface {
	AgesInFlight() bool
}
