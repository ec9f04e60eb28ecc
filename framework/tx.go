package framework

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/internal/pipeline"
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

// TxFromContext returns the transaction of the attempt running in ctx. Code
// that a handler calls (a repository, a command bus) joins the attempt
// through it, so its writes commit or roll back with the processed mark.
func TxFromContext(ctx context.Context) (*sqlx.Tx, bool) {
	t, ok := pipeline.From[*Tx](ctx)
	if !ok || t.Tx == nil {
		return nil, false
	}
	return t.Tx, true
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

// UnitOfWork runs each attempt in a transaction that holds the processed
// mark of the event: the mark and the handler's writes commit together, or
// roll back together. It is the one implementation of the exactly-once
// effect; Consume and the middleware step both use it.
type UnitOfWork struct {
	db    *sqlx.DB
	store Store
}

// UnitOfWorkConfig configures a UnitOfWork.
type UnitOfWorkConfig struct {
	// DB is the database of the handler's writes and of the store. Nil is
	// allowed only with memory.Store, and protects one process only.
	DB *sqlx.DB
	// Store keeps the processed marks and the delivery counts that the
	// transaction forgets. Required.
	Store Store
}

// NewUnitOfWork returns a UnitOfWork.
func NewUnitOfWork(cfg UnitOfWorkConfig) (*UnitOfWork, error) {
	if cfg.Store == nil {
		return nil, errors.New("UnitOfWorkConfig.Store: required (sqlite.NewStore, postgres.NewStore or memory.NewStore)")
	}
	return &UnitOfWork{db: cfg.DB, store: cfg.Store}, nil
}

// Outcome says what became of a delivery: the unit of work's Do and
// Consume return Processed, Duplicate or Failed; the consumer chain
// reports every outcome, and its metrics carry the outcome's text as a
// label.
type Outcome string

// The outcomes of a delivery.
const (
	// Processed: the handler ran and its effect committed.
	Processed Outcome = "processed"
	// Duplicate: the event had been processed; the handler did not run.
	Duplicate Outcome = "duplicate"
	// Stale: a newer event of the subject had taken effect (skip_stale);
	// the handler did not run.
	Stale Outcome = "stale"
	// DeadLettered: the message was stored as a dead letter and acked.
	DeadLettered Outcome = "dead_lettered"
	// Nacked: the message was handed back to the transport, to be
	// delivered again.
	Nacked Outcome = "nacked"
	// Failed: the attempt rolled back; the event is not processed.
	Failed Outcome = "failed"
)

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

	first, err := u.store.Mark(ctx, tx, consumer, key)
	if err != nil {
		return fail(fmt.Errorf("mark processed: %w", err))
	}
	outcome = Duplicate
	if first {
		outcome = Processed
		attemptCtx := pipeline.With(pipeline.With(ctx, tx), attempt{consumer: consumer, key: key})
		if err := fn(attemptCtx); err != nil {
			return fail(err)
		}
		if err := ctx.Err(); err != nil {
			return fail(err) // never commit an attempt cut short
		}
	} else if !pipeline.Counted(ctx) {
		// Nothing to write: a duplicate costs the insert that found its mark.
		done = true
		tx.rollback()
		return Duplicate, nil
	}
	// A processed event, or a duplicate whose delivery was counted (its
	// ack was lost): forget the count, so that lost acks never add up to
	// the delivery limit.
	if pipeline.Counted(ctx) {
		if err := u.store.Forget(ctx, tx, consumer, key); err != nil {
			return fail(fmt.Errorf("forget delivery count: %w", err))
		}
	}
	if a, ok := pipeline.From[pipeline.AckInTx](ctx); ok && tx.Tx != nil && a.DB == u.db.DB {
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
