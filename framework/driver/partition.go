package driver

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"
)

// Partitions split a consumer's subjects among its processes: each
// subject belongs to one partition (PartitionOf), each partition has one
// live owner at a time (a lease in the stores' database, see Leases), and
// the owner alone consumes it (see Assigner) and commits its effects,
// checked in their transaction (Leases.Fence).
const (
	// MaxPartitions is the most partitions a consumer may declare: on
	// RabbitMQ each is a quorum queue, a Raft group of its own on every
	// node of the cluster, and on every transport each is a lease that
	// its owner renews; 64 spread a consumer over more processes than a
	// service runs.
	MaxPartitions = 64
	// PartitionBuckets is how many buckets PartitionOf hashes a key into
	// before it takes the bucket modulo the partitions: the PostgreSQL
	// transport writes each message's bucket on its row.
	PartitionBuckets = 1024
	// DefaultLease is how long a partition's lease, and a process's
	// membership of its consumer's group, last without renewal: a
	// process that dies leaves its partitions to the others within it.
	DefaultLease = 15 * time.Second
)

// ErrFenced is returned by Leases.Fence when the process no longer holds
// a partition of the batch with the token it was given: another process
// owns it now, and the batch must not commit.
var ErrFenced = errors.New("partition lease lost: another process owns the partition now")

// Bucket returns the bucket of key among PartitionBuckets: the 32-bit
// FNV-1a hash of its bytes, modulo PartitionBuckets.
func Bucket(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % PartitionBuckets)
}

// PartitionKey is what decides an event's partition: its subject, or its
// id when it has none (such events have no order to keep).
func PartitionKey(subject, id string) string {
	if subject != "" {
		return subject
	}
	return id
}

// PartitionOf returns the partition, among n, of the bucket (see Bucket).
// With n of 1 or less it is 0.
func PartitionOf(bucket, n int) int {
	if n <= 1 {
		return 0
	}
	return bucket % n
}

// partitionKey is the context key of the partition of a message.
type partitionKey struct{}

// WithPartition returns ctx carrying the partition a message came from:
// a partitioned subscription sets it on each message it hands out.
func WithPartition(ctx context.Context, partition int) context.Context {
	return context.WithValue(ctx, partitionKey{}, partition)
}

// PartitionFromContext returns the partition that WithPartition set.
func PartitionFromContext(ctx context.Context) (int, bool) {
	p, ok := ctx.Value(partitionKey{}).(int)
	return p, ok
}

// Assigner is implemented by the Subscriber of a partitioned subscription
// (SubscribeConfig.Partitions above 1). It consumes no partition until
// told which.
type Assigner interface {
	// Assign makes the subscription consume the partitions given and no
	// other. It returns once the subscription hands out no further
	// message of a partition it dropped and every message of those it
	// handed out was settled (acked or nacked), or when ctx ends, with
	// ctx's error. A partition dropped this way is handed back without
	// returning a message to its transport, so a rebalance charges no
	// delivery.
	Assign(ctx context.Context, partitions []int) error
}

// A PartitionLease is a partition's owner, as Leases.PartitionLeases
// lists them.
type PartitionLease struct {
	Consumer  string
	Partition int
	// Owner is the member that holds the lease; empty when free.
	Owner string
	// Token is the fencing token: it grows each time the partition
	// changes owner.
	Token int64
	// Expires is when the lease ends unless renewed.
	Expires time.Time
}

// Fence is a partition and the token its owner was given: the unit of
// work checks the fences of a batch's messages in its transaction.
type Fence struct {
	Partition int
	Token     int64
}

// Check returns nil when member holds f's partition of consumer with f's
// token, its lease live; else an error wrapping ErrFenced that says why.
// lease is the partition's lease as the store reads it, nil when it has
// none; live says that it has not expired (by the store's clock). A
// store's Leases.Fence returns it for the first fence that fails.
func (f Fence) Check(consumer, member string, lease *PartitionLease, live bool) error {
	var why string
	switch {
	case lease == nil:
		why = "no one ever held it"
	case lease.Owner == "":
		why = "it was released"
	case lease.Owner != member:
		why = fmt.Sprintf("%s holds it", lease.Owner)
	case lease.Token != f.Token:
		why = fmt.Sprintf("its token is %d now", lease.Token)
	case !live:
		why = "the lease expired"
	default:
		return nil
	}
	return fmt.Errorf("partition %d of %s, fenced by %s with token %d: %s: %w", f.Partition, consumer, member, f.Token, why, ErrFenced)
}

// Leases is implemented by a Store that keeps the membership of a
// consumer's processes and the ownership of its partitions. Times are the
// database's: processes need not agree on the clock.
type Leases interface {
	// Heartbeat records that member is alive in consumer's group until
	// ttl from now, forgets the members whose time passed, and returns
	// the live members, member included, sorted.
	Heartbeat(ctx context.Context, consumer, member string, ttl time.Duration) ([]string, error)
	// Leave removes member from consumer's group and frees its leases.
	Leave(ctx context.Context, consumer, member string) error
	// Acquire gives member the lease of partition until ttl from now when
	// the lease is free, expired or member's already, and returns its
	// token: a new one, greater than every earlier token of the
	// partition, when the owner changed. ok is false when another member
	// holds it.
	Acquire(ctx context.Context, consumer string, partition int, member string, ttl time.Duration) (token int64, ok bool, err error)
	// Renew extends member's leases of consumer until ttl from now and
	// returns those it still holds, with their tokens.
	Renew(ctx context.Context, consumer, member string, ttl time.Duration) (map[int]int64, error)
	// Release frees partition when member holds it.
	Release(ctx context.Context, consumer string, partition int, member string) error
	// Fence checks, inside tx, that member holds each partition of
	// fences with its token, and returns an error wrapping ErrFenced
	// otherwise. Where the database can, it locks the leases until tx
	// ends, so that no lease moves between the check and the commit.
	Fence(ctx context.Context, tx *Tx, consumer, member string, fences []Fence) error
	// PartitionLeases lists the leases of consumer, by partition.
	PartitionLeases(ctx context.Context, consumer string) ([]PartitionLease, error)
	// PartitionCount records n as the number of partitions of consumer
	// unless one is recorded already, and returns the recorded one: a
	// consumer keeps the count it first ran with (see SetPartitionCount).
	PartitionCount(ctx context.Context, consumer string, n int) (int, error)
	// SetPartitionCount records n as the number of partitions of
	// consumer, whatever was recorded: for an operator who drained the
	// consumer and stopped its processes.
	SetPartitionCount(ctx context.Context, consumer string, n int) error
	// RecordedPartitionCount returns the number of partitions recorded
	// for consumer (see PartitionCount), 0 when none is, and records
	// nothing: for an operator's view.
	RecordedPartitionCount(ctx context.Context, consumer string) (int, error)
	// Members returns the live members of consumer's group (those whose
	// heartbeat has not expired), sorted, and changes nothing: for an
	// operator's view, or a check that no process of the consumer runs.
	Members(ctx context.Context, consumer string) ([]string, error)
}

// SessionEnder is implemented by a Leases whose database can end another
// process's sessions (PostgreSQL): a process frozen past its lease (a
// stopped VM, SIGSTOP, a long pause) keeps its sessions, and with them
// what they hold, a transaction's row locks, a session's advisory locks,
// until it goes on or the server ends them. The member that takes over
// the partition ends them first, so that nothing the stale owner holds
// keeps the partition from its new owner.
//
// The sessions of a member are those whose application_name is the
// member's name, on any database of the server: a process must name its
// connections after its member (postgres.OpenConfig.ApplicationName), as
// the app does. The database role must be allowed to end them: the
// stale process's own role, or a member of pg_signal_backend.
type SessionEnder interface {
	// EndStaleOwner ends the database sessions of the owner of
	// partition's lease, when the owner is not member, its lease expired,
	// it is no longer a live member of consumer's group (its heartbeat
	// expired too), and none of its sessions began or ended a statement
	// for quiet: a process that froze, not one that runs late. It returns
	// the owner whose lease and heartbeat expired, empty when there is
	// none, and how many sessions it ended, once they exited (their
	// locks released) or ctx ended. A SQLite store ends none: a
	// process's connections to the file are its own.
	EndStaleOwner(ctx context.Context, consumer string, partition int, member string, quiet time.Duration) (owner string, ended int, err error)
}

// validPartitions reports whether n is a valid SubscribeConfig.Partitions.
func validPartitions(n int) error {
	if n < 0 || n > MaxPartitions {
		return fmt.Errorf("must be between 1 and %d, got %d", MaxPartitions, n)
	}
	return nil
}
