package driver

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/framework"
)

// The purges of records past their retention, besides PurgeProcessed and
// PurgeOutbox (see Purger).
const (
	// PurgeDeliveries deletes the delivery counts of messages that
	// finished: the count of an event its consumer marked processed, of a
	// dead letter that was not replayed since it was stored, and any count
	// first made before the purge's time. A count of a message still
	// failing is kept, or its delivery limit would start again.
	PurgeDeliveries PurgeKind = "deliveries"
	// PurgeReplays deletes the replays published before the purge's time.
	PurgeReplays PurgeKind = "replays"
	// PurgeDeadLetters deletes the resolved (replayed or discarded) dead
	// letters resolved before the purge's time, with their history.
	// Pending dead letters are never purged, nor replayed ones whose
	// replay is not published yet.
	PurgeDeadLetters PurgeKind = "dead_letters"
)

// Purger deletes what a store keeps past its retention, in batches of
// bounded size, each in a short transaction of its own, and takes turns
// through a lease so that one process of a service purges at a time.
// sqlite.Store and postgres.Store implement it.
type Purger interface {
	// PurgeBatch deletes up to limit of the rows of kind older than
	// before (see the PurgeKind constants), and returns how many it
	// deleted. The transaction that deletes them records, when it deleted
	// any, that rows of kind older than before may be gone
	// (PurgeHorizons). For PurgeDeliveries a zero before deletes only the
	// counts of messages that finished.
	PurgeBatch(ctx context.Context, kind PurgeKind, before time.Time, limit int) (int64, error)
	// Purgeable counts the rows PurgeBatch would delete, deleting none.
	Purgeable(ctx context.Context, kind PurgeKind, before time.Time) (int64, error)
	// AcquireLease takes the lease name for holder until ttl from now, by
	// the store's clock, when no other holder has it or its lease ended,
	// and renews it when holder has it; it reports whether holder holds
	// it.
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// ReleaseLease ends holder's lease name; it does nothing when holder
	// does not hold it.
	ReleaseLease(ctx context.Context, name, holder string) error
}

// Gauges reads, from the database, the figures that every process of a
// service exports alike: the pending dead letters by consumer and code
// and the parked events by consumer. sqlite.Store and postgres.Store
// implement it.
type Gauges interface {
	// Figures reads the pending dead letters by consumer and code and the
	// parked events by consumer.
	Figures(ctx context.Context) (Figures, error)
}

// Figures are the gauges' values (see Gauges).
type Figures struct {
	// PendingDeadLetters count the dead letters waiting for an operator,
	// by consumer and code.
	PendingDeadLetters []PendingCount
	// Parked count the events parked behind a dead letter of their
	// subject, by consumer.
	Parked []ParkedCount
}

// PendingCount is how many dead letters of a consumer with a code are
// pending.
type PendingCount struct {
	Consumer string
	Code     framework.Code
	Count    int64
}

// ParkedCount is how many events of a consumer are parked.
type ParkedCount struct {
	Consumer string
	Count    int64
}

// TopicPurger is a transport that keeps its messages in tables of its
// own, which the purge deletes from: the messages every consumer group of
// a topic has passed, older than a retention. The purge runs it for the
// topics of the service's consumers, one process at a time, as it runs
// Purger. postgres.Transport implements it.
type TopicPurger interface {
	// PurgeTopicBatch deletes up to limit of topic's messages that every
	// consumer group of topic (every partition of a partitioned one) has
	// passed and that were written longer than olderThan ago, by the
	// database's clock, and returns how many it deleted.
	PurgeTopicBatch(ctx context.Context, topic string, olderThan time.Duration, limit int) (int64, error)
	// PurgeableTopic counts the messages PurgeTopicBatch would delete,
	// deleting none.
	PurgeableTopic(ctx context.Context, topic string, olderThan time.Duration) (int64, error)
}

// GroupRemover is a transport whose topics keep each consumer group's
// position, which holds back the purge of their messages (TopicPurger)
// until the group reads on: removing the group of a consumer nobody runs
// any more lets the purge go on. postgres.Transport implements it.
type GroupRemover interface {
	// RemoveGroup deletes consumer's group, and its partitions' groups,
	// from every topic of the transport, and returns them; with dryRun
	// it returns them and deletes nothing.
	RemoveGroup(ctx context.Context, consumer string, dryRun bool) ([]GroupPosition, error)
}

// GroupPosition is a consumer group's position in a topic's table.
type GroupPosition struct {
	// Table is where the group's position is kept: on PostgreSQL, the
	// topic's offsets table; on SQLite, the topic, in the Pub/Sub's
	// groups table.
	Table string
	// Group is the consumer group: the consumer's name, or one of its
	// partitions' groups.
	Group string
	// Offset is the offset of the last message the group acknowledged in
	// order.
	Offset int64
}

// GroupAdopter is a transport whose topics keep each consumer group's
// position. A consumer renamed on it (handlers.RenamedFrom) would
// otherwise be a new group, which reads every retained message from the
// start, and handles again each event the old name dead-lettered (those
// have no processed mark to make them duplicates). postgres.Transport
// and sqlite.Transport implement it.
type GroupAdopter interface {
	// AdoptGroup gives consumer's group, in each of topics (those it
	// subscribes: see Subscription.Topics) where it has no position
	// yet, the position of from's group (and of its partitions' groups,
	// to consumer's partitions of the same number): what from
	// acknowledged is not handed to consumer, what it had handed out and
	// not acknowledged is, in one transaction. It returns the positions
	// adopted; running it again adopts none where consumer has read
	// since. Stop every process of from first: what it acknowledges
	// afterwards is handed to consumer again.
	AdoptGroup(ctx context.Context, consumer, from string, topics []string) ([]GroupPosition, error)
}
