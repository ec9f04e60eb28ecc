package framework

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// Tx is the transaction of one attempt. Its embedded *sqlx.Tx is nil when
// the unit of work has no database (the in-memory store). Stores use the
// hooks to act when the transaction ends.
type Tx struct {
	*sqlx.Tx

	db            *sqlx.DB
	afterCommit   []func()
	afterRollback []func()
}

// OnCommit registers f to run after the transaction committed.
func (t *Tx) OnCommit(f func()) { t.afterCommit = append(t.afterCommit, f) }

// OnRollback registers f to run after the transaction rolled back, or
// failed to commit.
func (t *Tx) OnRollback(f func()) { t.afterRollback = append(t.afterRollback, f) }

func (t *Tx) commit() error {
	if t.Tx != nil {
		if err := t.Tx.Commit(); err != nil {
			t.rolledBack()
			return fmt.Errorf("commit: %w", err)
		}
	}
	for _, f := range t.afterCommit {
		f()
	}
	return nil
}

func (t *Tx) rollback() {
	if t.Tx != nil {
		_ = t.Tx.Rollback() // the attempt's error is what matters
	}
	t.rolledBack()
}

func (t *Tx) rolledBack() {
	for _, f := range t.afterRollback {
		f()
	}
}

type txKey struct{}

// TxFromContext returns the transaction of the attempt running in ctx. Code
// that a handler calls (a repository, a command bus) joins the attempt
// through it, so its writes commit or roll back with the processed mark.
func TxFromContext(ctx context.Context) (*sqlx.Tx, bool) {
	t, ok := ctx.Value(txKey{}).(*Tx)
	if !ok || t.Tx == nil {
		return nil, false
	}
	return t.Tx, true
}

// AttemptTx returns the framework's transaction of the attempt running in
// ctx, for stores that take part in it (see CheckpointStore).
func AttemptTx(ctx context.Context) (*Tx, bool) {
	t, ok := ctx.Value(txKey{}).(*Tx)
	return t, ok
}

// Conn returns the attempt's transaction when ctx carries one, else db:
//
//	_, err := framework.Conn(ctx, r.db).ExecContext(ctx, `INSERT ...`)
func Conn(ctx context.Context, db *sqlx.DB) sqlx.ExtContext {
	if tx, ok := TxFromContext(ctx); ok {
		return tx
	}
	return db
}

// AckInTx lets a transport acknowledge a message inside the handler's
// transaction, so that the effect and the ack commit together. A transport
// sets it on the message context with WithAckInTx; the unit of work calls
// Ack before commit when its database is DB.
type AckInTx struct {
	DB  *sql.DB
	Ack func(ctx context.Context, tx *sql.Tx) error
}

type ackKey struct{}

// WithAckInTx returns ctx carrying a.
func WithAckInTx(ctx context.Context, a AckInTx) context.Context {
	return context.WithValue(ctx, ackKey{}, a)
}

// UnitOfWork runs each attempt in a transaction that holds the processed
// mark of the event: the mark and the handler's writes commit together, or
// roll back together. It is the one implementation of the exactly-once
// effect; Consume and the middleware step both use it.
type UnitOfWork struct {
	db         *sqlx.DB
	processed  ProcessedStore
	deliveries DeliveryStore
}

// UnitOfWorkConfig configures a UnitOfWork.
type UnitOfWorkConfig struct {
	// DB is the database of the handler's writes and of the stores. Nil is
	// allowed only with an in-memory ProcessedStore, and protects one
	// process only.
	DB *sqlx.DB
	// Processed stores the processed marks. Required.
	Processed ProcessedStore
	// Deliveries, when set, has its count of an event forgotten in the
	// transaction that processes it.
	Deliveries DeliveryStore
}

// ErrMissingProcessedStore is returned by NewUnitOfWork without a store.
var ErrMissingProcessedStore = errors.New("missing processed store (try sqlite.NewStore, postgres.NewStore or memory.NewStore)")

// NewUnitOfWork returns a UnitOfWork.
func NewUnitOfWork(cfg UnitOfWorkConfig) (*UnitOfWork, error) {
	if cfg.Processed == nil {
		return nil, ErrMissingProcessedStore
	}
	return &UnitOfWork{db: cfg.DB, processed: cfg.Processed, deliveries: cfg.Deliveries}, nil
}

// Outcome says what Do did with an event.
type Outcome int

// The outcomes of Do.
const (
	// Failed: the attempt rolled back; the event is not processed.
	Failed Outcome = iota
	// Processed: the handler ran and its effect committed.
	Processed
	// Duplicate: the event had been processed; the handler did not run.
	Duplicate
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	default:
		return "failed"
	}
}

// Do runs fn once for the event key of consumer: it begins a transaction,
// marks the event processed in it and runs fn with a context that carries
// the transaction (see TxFromContext). It commits when fn returns nil, and
// rolls back, mark included, when fn fails, panics or ctx ends. When the
// mark exists, fn does not run and Do returns Duplicate.
func (u *UnitOfWork) Do(ctx context.Context, consumer string, key Key, fn func(ctx context.Context) error) (outcome Outcome, err error) {
	tx := &Tx{db: u.db}
	if u.db != nil {
		tx.Tx, err = u.db.BeginTxx(ctx, nil)
		if err != nil {
			return Failed, fmt.Errorf("begin: %w", err)
		}
	}
	done := false
	defer func() {
		if !done {
			tx.rollback() // fn panicked; the panic goes on up
		}
	}()
	fail := func(err error) (Outcome, error) {
		done = true
		tx.rollback()
		return Failed, err
	}

	first, err := u.processed.Mark(ctx, tx, consumer, key)
	if err != nil {
		return fail(fmt.Errorf("mark processed: %w", err))
	}
	outcome = Duplicate
	if first {
		outcome = Processed
		attemptCtx := context.WithValue(context.WithValue(ctx, txKey{}, tx), attemptKey{}, attempt{consumer: consumer, key: key})
		if err := fn(attemptCtx); err != nil {
			return fail(err)
		}
		if err := ctx.Err(); err != nil {
			return fail(err) // never commit an attempt cut short
		}
	} else if !deliveryCounted(ctx) {
		// Nothing to write: a duplicate costs the insert that found its mark.
		done = true
		tx.rollback()
		return Duplicate, nil
	}
	// A processed event, or a duplicate whose delivery was counted (its
	// ack was lost): forget the count, so that lost acks never add up to
	// the delivery limit.
	if u.deliveries != nil && deliveryCounted(ctx) {
		if err := u.deliveries.Forget(ctx, tx, consumer, key); err != nil {
			return fail(fmt.Errorf("forget delivery count: %w", err))
		}
	}
	if a, ok := ctx.Value(ackKey{}).(AckInTx); ok && tx.Tx != nil && a.DB == u.db.DB {
		if err := a.Ack(ctx, tx.Tx.Tx); err != nil {
			return fail(fmt.Errorf("ack in transaction: %w", err))
		}
	}
	done = true
	if err := tx.commit(); err != nil {
		return Failed, err
	}
	return outcome, nil
}

type countedKey struct{}

// WithDeliveryCounted marks ctx as handling a delivery whose count the
// delivery guard recorded, so the unit of work forgets the count when the
// effect commits.
func WithDeliveryCounted(ctx context.Context) context.Context {
	return context.WithValue(ctx, countedKey{}, true)
}

func deliveryCounted(ctx context.Context) bool {
	v, _ := ctx.Value(countedKey{}).(bool)
	return v
}
