package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/crash"
)

// UnitOfWork runs each attempt in a transaction that holds the processed
// mark of the event: the mark and the handler's writes commit together, or
// roll back together. It is the one implementation of the exactly-once
// effect; Consume and the consumer chain both use it.
//
// With a database it commits in groups (unless BatchSize is 1): the
// attempts that arrive while earlier ones commit are gathered into batches
// of up to BatchSize, and a batch runs in one transaction on one
// connection, its attempts one after another, with no savepoint between
// them. When an attempt fails (error, panic, deadline), the transaction
// rolls back: the failed attempt keeps its failure, and the others run
// again, handler included, in a new transaction without it. So a handler
// may run more than once for one delivery; its effect commits once. When
// the commit fails, the attempts that had succeeded run again, each
// alone, before any is charged a failure. Up to Batches batches run at
// once.
//
// Group commit adapts to where the attempts' time goes: on PostgreSQL,
// while the consumer's handlers spend their time outside the database (an
// HTTP call, a mailer: more than OutsideThreshold, on a moving average,
// outside their statements), attempts do not wait for each other in a
// batch: each runs at once, its transaction begun at its handler's first
// statement, the connections they hold bounded by Overlap. Once the
// handlers' time goes to the database again, the attempts gather into
// batches again.
type UnitOfWork struct {
	db          *sqlx.DB
	store       Store
	withoutMark bool
	group       *group
	ping        sharedPing
}

// Defaults of UnitOfWorkConfig.
const (
	// DefaultBatchSize is the most attempts one transaction holds. A
	// larger batch commits less often, but runs more of its attempts
	// again when one of them fails.
	DefaultBatchSize = 32
	// DefaultBatches is how many batches run at once, each on a
	// connection of its own: one runs its attempts while the other
	// commits.
	DefaultBatches = 2
	// DefaultOverlap is the most connections a consumer's attempts hold
	// at once, besides its batches', while its handlers wait outside the
	// database.
	DefaultOverlap = 32
	// OutsideThreshold is the time a handler spends outside its
	// statements, on a moving average of the consumer's attempts, from
	// which its attempts overlap instead of running one after another in
	// a batch (see UnitOfWork). A batch's attempts share a commit, whose
	// cost is below it; a wait above it, run serially, would cost more
	// than a commit of each attempt's own.
	OutsideThreshold = time.Millisecond
)

// UnitOfWorkConfig configures a UnitOfWork.
type UnitOfWorkConfig struct {
	// DB is the database of the handler's writes and of the store. Nil is
	// allowed only with memory.Store, and protects one process only.
	DB *sqlx.DB
	// Store keeps the processed marks and the delivery counts that the
	// transaction forgets. Required.
	Store Store
	// BatchSize is the most attempts that commit in one transaction.
	// Defaults to DefaultBatchSize; 1 gives each attempt a transaction of
	// its own, which no other attempt's failure runs again.
	BatchSize int
	// Batches is how many batches run at once. Defaults to
	// DefaultBatches. A batch that could start while another runs waits,
	// unless it fills up, until that one ends, so that under load batches
	// hold many attempts.
	Batches int
	// Linger is how long a batch that could start waits for more
	// attempts while it holds fewer than BatchSize. Zero starts it at
	// once: a batch then holds the attempts that arrived while the
	// previous ones ran, which adds no wait when the load is low.
	Linger time.Duration
	// Overlap is the most connections that the attempts hold at once,
	// besides the batches', while the handlers' time goes outside the
	// database (see UnitOfWork), on PostgreSQL: each for an attempt's
	// own transaction, for the statement that reads an event's mark
	// before its handler runs, or for the batch that the attempts share
	// from their first statements. How many attempts wait outside the
	// database at once it does not bound: they hold no connection
	// meanwhile. 1 keeps the attempts in batches whatever their handlers
	// do. SQLite has one writer: there attempts never overlap. Defaults
	// to DefaultOverlap.
	Overlap int
	// WithoutMark runs every attempt without the processed mark: the
	// attempt still runs in its transaction, group commit included, but
	// every delivery runs the handler, a redelivery of a processed event
	// too, and Do never returns Duplicate. Only for a consumer whose
	// effect is idempotent by itself (see handlers.WithoutDedup).
	// Defaults to false.
	WithoutMark bool
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c UnitOfWorkConfig) WithDefaults() UnitOfWorkConfig {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Batches = cmp.Or(c.Batches, DefaultBatches)
	c.Overlap = cmp.Or(c.Overlap, DefaultOverlap)
	return c
}

// Validate reports the first invalid field of c.
func (c UnitOfWorkConfig) Validate() error {
	switch {
	case c.Store == nil:
		return errors.New("UnitOfWorkConfig.Store: required (sqlite.NewStore, postgres.NewStore or memory.NewStore)")
	case c.BatchSize < 1:
		return fmt.Errorf("UnitOfWorkConfig.BatchSize: must be at least 1, got %d", c.BatchSize)
	case c.Batches < 1:
		return fmt.Errorf("UnitOfWorkConfig.Batches: must be at least 1, got %d", c.Batches)
	case c.Overlap < 1:
		return fmt.Errorf("UnitOfWorkConfig.Overlap: must be at least 1, got %d", c.Overlap)
	case c.Linger < 0:
		return fmt.Errorf("UnitOfWorkConfig.Linger: must not be negative, got %s", c.Linger)
	case MarkScopeOf(c.Store) == MarkOutlivesRollback:
		return fmt.Errorf("UnitOfWorkConfig.Store: mark check: processed store %T keeps its marks outside the "+
			"database transaction and keeps them when an attempt fails, so a failed attempt's redelivery would be "+
			"skipped as a duplicate and its effect lost (use a store whose marks join the transaction, such as "+
			"sqlite.Store or postgres.Store, or one that releases them on rollback: see driver.MarkScope)", c.Store)
	}
	return nil
}

// MarkScope says how a Store's processed marks relate to the attempt's
// database transaction, which decides what the exactly-once effect
// survives. A Store declares it with a method MarkScope() MarkScope; a
// Store without one keeps its marks in the transaction, as the Store
// contract asks.
type MarkScope int

// The scopes of a Store's marks.
const (
	// MarkInTx: the mark is a write of the attempt's transaction
	// (sqlite.Store, postgres.Store): it commits with the handler's
	// writes, or rolls back with them, whatever happens to the process.
	MarkInTx MarkScope = iota
	// MarkReleasedOnRollback: the mark is kept outside the database, and
	// released when the attempt's transaction rolls back or fails to
	// commit (Tx.OnRollback), so a failed attempt's redelivery runs the
	// handler again (memory.Store). It cannot join a database's
	// transaction: it does not survive the process, so after a crash or
	// a restart an event delivered again (its ack was lost, the crash
	// came between the commit and the ack) runs its handler again and
	// its effect in the database happens twice; and another process
	// does not see it.
	MarkReleasedOnRollback
	// MarkOutlivesRollback: the mark is kept outside the database and
	// stays when the attempt fails, so the redelivery would be skipped
	// as a duplicate and the effect lost. NewUnitOfWork refuses such a
	// store (the mark check).
	MarkOutlivesRollback
)

// MarkScopeOf returns the scope that s declares (a method MarkScope()
// MarkScope), MarkInTx when it declares none.
func MarkScopeOf(s Store) MarkScope {
	if d, ok := s.(interface{ MarkScope() MarkScope }); ok {
		return d.MarkScope()
	}
	return MarkInTx
}

// NewUnitOfWork returns a UnitOfWork.
func NewUnitOfWork(cfg UnitOfWorkConfig) (*UnitOfWork, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u := &UnitOfWork{db: cfg.DB, store: cfg.Store, withoutMark: cfg.WithoutMark}
	if cfg.DB != nil && cfg.BatchSize > 1 {
		u.group = &group{u: u, size: cfg.BatchSize, linger: cfg.Linger, batches: cfg.Batches, free: cfg.Batches}
		if cfg.Overlap > 1 && cfg.DB.DriverName() == "pgx" {
			u.group.overlap = make(chan struct{}, cfg.Overlap)
		}
	}
	return u, nil
}

// Do runs fn once for the event key of consumer: in a transaction (shared
// with other attempts under group commit), it marks the event processed
// and runs fn with a context that carries the transaction (see
// TxFromContext). The effect commits when fn returns nil, and rolls back,
// mark included, when fn fails, panics or ctx ends. When the mark exists,
// fn does not run and Do returns Duplicate. Without the mark
// (UnitOfWorkConfig.WithoutMark), fn runs on every call. Do returns once
// the effect committed or rolled back: a message may be acked then.
func (u *UnitOfWork) Do(ctx context.Context, consumer string, key framework.Key, fn func(ctx context.Context) error) (framework.Outcome, error) {
	return u.DoDelivery(ctx, consumer, key, Delivery{}, fn)
}

// Delivery is what the consumer chain knows of the delivery whose event
// an attempt of DoDelivery handles, beyond its consumer and key.
type Delivery struct {
	// Counted says that the delivery guard counted the delivery
	// (Store.Count): the attempt forgets the count in the transaction
	// that commits its effect, or that finds the event processed, so
	// that lost acks never add up to the delivery limit.
	Counted bool
	// Ack, when its DB is the unit of work's database, acknowledges the
	// message inside the attempt's transaction, before its commit (see
	// TxAcker). The zero TxAck leaves the ack to the transport.
	Ack TxAck
	// Fencer, when set, checks before the commit that this process still
	// owns Partition, the partition the message came from (see
	// Leases.Fence): a batch checks its attempts' partitions in one call.
	// An attempt whose partition moved to another process fails with an
	// error wrapping ErrFenced, its effect rolled back.
	Fencer Fencer
	// Partition is the partition of the message, for Fencer.
	Partition int
	// OrderedSubject is the event's subject when its consumer applies
	// each subject's events in sequence (strict order): on PostgreSQL a
	// batch then reads and locks its attempts' checkpoints in one
	// statement, and moves them in one statement before its commit,
	// instead of two statements an attempt. Empty otherwise.
	OrderedSubject string
	// OrderedSeq is the event's subjectseq, with OrderedSubject: a batch
	// whose events are at their turn by the checkpoints its process
	// committed last moves them before its handlers run, in the
	// statement that marks the events, instead of in one more after them.
	OrderedSeq int64
}

// Fencer checks, inside the transaction of a batch's attempts, that this
// process owns their partitions (see Leases.Fence): the runner of a
// partitioned consumer implements it with the tokens of its leases.
type Fencer interface {
	// Fence returns an error wrapping ErrFenced when this process no
	// longer owns one of partitions.
	Fence(ctx context.Context, tx *Tx, partitions []int) error
}

// Ping reports whether the unit of work's database answers, within ctx;
// nil without a database (memory.Store). The consumer chain asks it when
// an attempt ran out of time, to tell the database's outage from the
// attempt's own slowness, and while its attempts pause for an outage.
// Calls made while one is in flight share its answer (see sharedPing):
// however many messages pause, the consumer pings through one
// connection of its pool at a time.
func (u *UnitOfWork) Ping(ctx context.Context) error {
	if u == nil || u.db == nil {
		return nil
	}
	return u.ping.do(ctx, u.db.PingContext)
}

// DoDelivery is Do for a delivery that d describes: the consumer chain
// runs each attempt of a message with it.
func (u *UnitOfWork) DoDelivery(ctx context.Context, consumer string, key framework.Key, d Delivery, fn func(ctx context.Context) error) (framework.Outcome, error) {
	a := &attemptRun{ctx: ctx, consumer: consumer, key: key, fn: fn, delivery: d, crash: crash.HookOf(ctx)}
	if u.group == nil {
		u.alone(a)
	} else {
		u.group.run(a)
	}
	if a.panicked != nil {
		panic(a.panicked) // on the attempt's own goroutine, for its chain's recovery
	}
	if a.hookPanicked != nil {
		panic(a.hookPanicked) // a hook's, which ran on the batch's goroutine
	}
	return a.outcome, a.err
}
