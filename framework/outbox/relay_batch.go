package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// batchResult is what a finished batch published.
type batchResult struct {
	published int
	err       error
}

// batch is a batch of rows read and published: finish waits for what is
// still on its way (confirms, marks), ends the batch (commit, release) and
// returns how many rows it marked sent. more reports that rows may wait
// behind it (it was full, by rows or by bytes); holds, that it keeps rows
// it did not read from the next batch until it finishes.
type batch struct {
	more, holds bool
	finish      func() (published int, err error)
}

// startBatch reads a batch, leaving out the rows of skip, and publishes
// it.
func (r *Relay) startBatch(ctx context.Context, skip sqlstore.Skip) (batch, error) {
	// A batch publishes no row once ctx ends or BatchTimeout passed
	// (publish checks pctx between rows); what it published by then is
	// still confirmed and marked, under bctx: it outlives ctx, so that a
	// stop does not leave published rows unmarked, and the publishing
	// deadline by as long again (within the SQLite lease), so that a slow
	// batch marks what went out instead of publishing it again at every
	// poll.
	pctx, stop := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*r.cfg.BatchTimeout)
	var (
		b   batch
		err error
	)
	if r.sql.Dialect() == sqlstore.Postgres {
		b, err = r.startClaimed(pctx, bctx, skip)
	} else {
		b, err = r.startLeased(pctx, bctx, skip)
	}
	if err != nil {
		stop()
		cancel()
		return batch{}, err
	}
	finish := b.finish
	b.finish = func() (int, error) {
		defer cancel()
		defer stop()
		return finish()
	}
	return b, nil
}

// startLeased reads and publishes a batch on SQLite: it takes a lease on
// its rows, and releases those it could not publish when it finishes.
func (r *Relay) startLeased(ctx, bctx context.Context, skip sqlstore.Skip) (batch, error) {
	// The lease is a write: an idle poll reads first, so that it never
	// waits for the file's write lock (a long handler transaction holds it)
	// when there is nothing to publish. The read stops with ctx; the
	// lease runs under bctx: interrupted by a stop after its statement
	// committed, it would hold rows that no finish releases, and the
	// relay's last pass at stop would skip them.
	waiting, err := r.sql.Unsent(ctx, r.db, 1)
	if err != nil || len(waiting) == 0 {
		return batch{finish: func() (int, error) { return 0, nil }}, err
	}
	now := r.cfg.Now()
	rows, more, err := r.sql.Lease(bctx, r.db, r.cfg.BatchSize, r.cfg.BatchBytes, now, now.Add(2*r.cfg.BatchTimeout), skip)
	if err != nil {
		return batch{}, err
	}
	published := r.publish(ctx, bctx, rows, func(ctx context.Context, ids []int64) error {
		return r.sql.MarkSent(ctx, r.db, ids, r.cfg.Now())
	})
	return batch{more: more, finish: func() (int, error) {
		sent, dropped, pubErr := published()
		if rest := unsentIDs(rows, sent); len(rest) > 0 {
			if err := r.sql.Release(bctx, r.db, rest); err != nil {
				pubErr = errors.Join(pubErr, err) // the lease ends by itself
			}
		}
		return len(sent) - dropped, pubErr
	}}, nil
}

// claimIdleGrace is how long past its batch's end the server lets a
// claim's transaction wait idle before it ends it (see startClaimed).
const claimIdleGrace = 2 * time.Second

// unsentIDs returns the ids of rows that are not in sent.
func unsentIDs(rows []sqlstore.OutboxRow, sent []int64) []int64 {
	if len(sent) == len(rows) {
		return nil
	}
	marked := make(map[int64]struct{}, len(sent))
	for _, id := range sent {
		marked[id] = struct{}{}
	}
	rest := make([]int64, 0, len(rows)-len(sent))
	for _, row := range rows {
		if _, ok := marked[row.ID]; !ok {
			rest = append(rest, row.ID)
		}
	}
	return rest
}

// startClaimed reads and publishes a batch on PostgreSQL: the rows are
// locked from the read to the commit of their marks, when it finishes.
// Each statement of its transaction is bounded (see Relay.bound): a lost
// one ends the batch, whose rows go out again at a later poll. The
// transaction waits idle on the server while the rows are published; a
// relay frozen or cut off from the server meanwhile cannot end it, so the
// server does once it waited idle past the batch's own end (bctx, twice
// BatchTimeout) by claimIdleGrace: until then it would hold its rows from
// every other relay, and hold back the server's transaction horizon, below
// which the PostgreSQL transport reads (see postgres.Transport).
func (r *Relay) startClaimed(ctx, bctx context.Context, skip sqlstore.Skip) (batch, error) {
	txCtx, cancelTx := context.WithCancel(bctx)
	var tx *sqlx.Tx
	err := r.bound.Watch(bctx, cancelTx, func() (err error) {
		tx, err = r.db.BeginTxx(txCtx, nil)
		return err
	})
	if err != nil {
		cancelTx()
		return batch{}, fmt.Errorf("outbox: begin: %w", err)
	}
	var (
		rows []sqlstore.OutboxRow
		held bool
	)
	err = r.bound.Run(bctx, func(sctx context.Context) (err error) {
		rows, held, err = r.sql.Claim(sctx, tx, r.cfg.BatchSize, r.cfg.BatchBytes, skip, 2*r.cfg.BatchTimeout+claimIdleGrace)
		return err
	})
	if err != nil {
		_ = tx.Rollback()
		cancelTx()
		return batch{}, err
	}
	published := r.publish(ctx, bctx, rows, func(ctx context.Context, ids []int64) error {
		return r.bound.Run(ctx, func(sctx context.Context) error {
			return r.sql.MarkSent(sctx, tx, ids, r.cfg.Now())
		})
	})
	return batch{more: held || len(rows) == r.cfg.BatchSize, holds: held, finish: func() (int, error) {
		defer cancelTx()
		defer tx.Rollback() // a no-op after Commit
		sent, dropped, pubErr := published()
		if err := r.bound.Watch(bctx, cancelTx, tx.Commit); err != nil {
			return 0, errors.Join(pubErr, fmt.Errorf("outbox: commit marks: %w", err))
		}
		return len(sent) - dropped, pubErr
	}}, nil
}
