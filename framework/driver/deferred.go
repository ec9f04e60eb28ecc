package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// This file holds the attempts whose transaction begins at their
// handler's first statement: while a consumer's handlers wait outside
// the database (see group.observe), an attempt that runs alone holds no
// connection, and no transaction stays open, while its handler waits.

// Peeker is a Store that reads, outside any transaction, whether an
// event is marked and its subject's checkpoint (sqlite.Store and
// postgres.Store do). The unit of work reads it before a handler that
// waits outside the database runs; the chain, before it dead-letters a
// message that did not route (a copy of a processed event is a
// duplicate).
type Peeker interface {
	// Peek reports, in one statement, whether consumer processed the
	// event key, or discarded its dead letter (see Store.Mark), and the
	// checkpoint of subject (0 when it has none; subject may be empty).
	Peek(ctx context.Context, consumer string, key framework.Key, subject string) (processed bool, checkpoint int64, err error)
}

// errDeferredLost fails the first statement of an attempt whose
// transaction began at it when what the attempt read before its handler
// ran no longer holds: another delivery of its event marked it, or its
// subject's checkpoint moved. The attempt then runs again, its
// transaction begun before its handler (see UnitOfWork.deferred).
var errDeferredLost = errors.New("the event was marked, or its subject's checkpoint moved, while the handler ran outside its transaction")

// defers reports whether a, about to run alone while the group's handlers
// wait outside the database, runs with its transaction begun at its
// handler's first statement: on PostgreSQL, with a store that peeks and
// moves checkpoints as batches do, when a marks its event.
func (u *UnitOfWork) defers(a *attemptRun) bool {
	if a.eager || u.withoutMark || u.db == nil || u.db.DriverName() != "pgx" {
		return false
	}
	if _, ok := u.store.(Peeker); !ok {
		return false
	}
	if _, ok := u.store.(manyMarker); !ok {
		return false
	}
	_, ok := u.store.(orderBatcher)
	return ok && u.group != nil
}

// deferred runs a with its transaction begun at its handler's first
// statement (or, when it makes none, once it returned). Before the handler
// runs, one statement outside any transaction reads whether the event is
// marked and its subject's checkpoint: a processed event is a duplicate,
// at no more cost. At its first statement the attempt joins the group's
// next deferred batch (see group.join): the attempts that reach theirs
// while a batch runs share the next one's transaction, one after another,
// so that its marks, checkpoints, fences, acks and commit are made once
// for all of them. When a's mark is not new or its checkpoint not as read
// (another delivery of the event, or a move of the partition, came while
// its handler waited outside), or a batch-mate's failure rolled the batch
// back, the attempt runs again as alone runs it, its transaction begun
// before its handler. It reports false, having run nothing, when a must
// run as alone runs it (a duplicate whose delivery was counted: its count
// is forgotten in a transaction).
func (u *UnitOfWork) deferred(a *attemptRun) bool {
	subject := a.delivery.OrderedSubject
	if !u.group.token(a) {
		return true
	}
	processed, checkpoint, err := u.store.(Peeker).Peek(a.ctx, a.consumer, a.key, subject)
	u.group.untoken()
	switch {
	case err != nil:
		a.tx = &Tx{}
		a.fail(err)
		return true
	case processed && a.delivery.Counted:
		return false
	case processed:
		a.tx = &Tx{}
		a.outcome = framework.Duplicate
		return true
	}
	a.tx = &Tx{db: u.db}
	a.joined = nil
	a.tx.begin = func() (*sqlx.Tx, error) { return u.group.join(a, checkpoint) }
	// Its fence, ack and checkpoint's move are its batch's to make.
	a.marked, a.first, a.batched, a.acking, a.fencing, a.order = true, true, true, false, false, nil
	if subject != "" {
		a.order = &pipeline.OrderStep{Checkpoint: checkpoint}
	}
	write := u.attempt(a)
	if write && a.err == nil && a.panicked == nil && a.died == "" {
		if err := a.tx.open(); err != nil && !errors.Is(err, errDeferredLost) && a.died == "" {
			a.fail(err)
		}
	}
	lost := a.tx.deferredLost() // after the handler's statements: a.joined is set
	if j := a.joined; j != nil {
		j.write = write
		close(j.ended) // the batch goes on with the next attempt
		switch <-j.result {
		case joinCommitted:
			if !a.dies(a.ctx, crash.AfterCommit) {
				a.committed()
			}
			return true
		case joinSettled:
			a.rolledBack()
			return true
		case joinFailed:
			a.rolledBack() // a keeps its failure
			return true
		case joinDied:
			return true
		}
		// joinAgain: its effect rolled back with the batch.
	} else if !lost {
		u.end(a, write) // it failed, or wrote nothing, before it joined
		return true
	}
	a.rolledBack()
	a.outcome, a.err, a.panicked, a.eager = "", nil, nil, true
	u.group.aloneWithToken(a)
	return true
}

// joinResult is what the batch that a deferred attempt joined made of it.
type joinResult int

const (
	// joinCommitted: the batch committed the attempt's effect.
	joinCommitted joinResult = iota
	// joinSettled: the attempt had nothing to write.
	joinSettled
	// joinFailed: the attempt failed (its own error, panic or statement),
	// and the batch rolled back.
	joinFailed
	// joinDied: the attempt died at a crash point; the batch ended
	// unfinished.
	joinDied
	// joinAgain: the batch rolled back for another reason (a batch-mate's
	// failure, a moved checkpoint, a fence, the commit): the attempt runs
	// again alone.
	joinAgain
)

// joining is a deferred attempt in the group's next batch (see
// group.join).
type joining struct {
	// checkpoint is the subject's checkpoint the attempt read before its
	// handler ran.
	checkpoint int64
	// grant hands the attempt the batch's transaction when its turn
	// comes, or the error that keeps it out of the batch.
	grant chan joinGrant
	// ended is closed once the attempt ran, its statements in the batch's
	// transaction made; write then says whether it has something to
	// commit.
	ended chan struct{}
	write bool
	// result is what the batch made of the attempt.
	result chan joinResult
}

// joinGrant is the batch's transaction, or the error that keeps an
// attempt out of it.
type joinGrant struct {
	tx  *sqlx.Tx
	err error
}

// join puts a, a deferred attempt at its handler's first statement, in
// the group's next deferred batch, and returns the batch's transaction
// once a's turn in it comes: its event marked and its subject's
// checkpoint locked. The attempts that join while a batch runs make the
// next one.
func (g *group) join(a *attemptRun, checkpoint int64) (*sqlx.Tx, error) {
	j := &joining{checkpoint: checkpoint, grant: make(chan joinGrant, 1), ended: make(chan struct{}), result: make(chan joinResult, 1)}
	a.joined = j
	g.joinMu.Lock()
	g.joins = append(g.joins, a)
	if !g.joinLeading {
		g.joinLeading = true
		go g.leadJoins()
	}
	g.joinMu.Unlock()
	gr := <-j.grant
	if gr.err != nil {
		a.joined = nil // never in the batch: it fails, or runs again alone
		return nil, gr.err
	}
	return gr.tx, nil
}

// leadJoins runs the deferred batches, each of the attempts that joined
// while the one before ran, up to the group's size, until none waits.
func (g *group) leadJoins() {
	for {
		g.joinMu.Lock()
		n := min(len(g.joins), g.size)
		if n == 0 {
			g.joinLeading = false
			g.joinMu.Unlock()
			return
		}
		batch := g.joins[:n:n]
		g.joins = g.joins[n:]
		g.joinMu.Unlock()
		g.overlap <- struct{}{} // the batch's connection (see token)
		g.runJoined(batch)
		g.untoken()
	}
}

// runJoined runs batch, deferred attempts at their first statement, in
// one transaction: it marks their events and locks their checkpoints,
// hands the transaction to each in turn until its handler returned, then
// moves the checkpoints, checks the fences, writes the acks and commits.
// An attempt whose mark or checkpoint is not as it read runs again alone;
// so does every attempt of a batch that rolls back for another's sake.
func (g *group) runJoined(batch []*attemptRun) {
	ctx, stop := batchContext(batch)
	defer stop()
	tx, timeout, in := g.beginJoined(ctx, batch)
	if tx == nil {
		return
	}
	ctx = context.WithoutCancel(ctx) // as a batch's statements do (see try)
	var (
		ran   []*attemptRun // attempts whose turn came
		ok    []*attemptRun // ... with something to commit
		again = func(rest []*attemptRun) {
			_ = tx.Rollback() // the batch rolls back (or dies): each other attempt runs again alone
			refuse(rest, errDeferredLost)
			for _, a := range ran {
				a.joined.result <- joinAgain
			}
		}
	)
	for i, a := range in {
		if a.dies(a.ctx, crash.AfterMark) {
			a.joined.grant <- joinGrant{err: a.err} // the batch dies unfinished (see died)
			again(in[i+1:])
			return
		}
		a.tx.ctx = ctx
		a.joined.grant <- joinGrant{tx: tx}
		<-a.joined.ended
		switch {
		case a.died != "":
			a.joined.result <- joinDied // the batch dies unfinished
			again(in[i+1:])
			return
		case a.err != nil || a.panicked != nil:
			a.joined.result <- joinFailed
			again(in[i+1:])
			return
		case a.tx.failed:
			// A statement of a failed and a returned nil: on PostgreSQL
			// the transaction is aborted. a runs again alone, where
			// its own commit fails, and so does every other.
			ran = append(ran, a)
			again(in[i+1:])
			return
		}
		ran = append(ran, a)
		if a.joined.write {
			ok = append(ok, a)
		}
		if a.tx.setsSession {
			if err := g.resetSession(ctx, tx, timeout); err != nil {
				again(in[i+1:])
				return
			}
		}
	}
	if len(ok) == 0 {
		_ = tx.Rollback() // nothing to commit
		for _, a := range ran {
			a.joined.result <- joinSettled
		}
		return
	}
	advanced, err := g.advanceAll(ctx, ok, nil)
	if err != nil {
		again(nil)
		return
	}
	if err := fenceAll(ctx, ok); err != nil {
		again(nil)
		return
	}
	for i, a := range ran {
		if a.fencing && a.dies(a.ctx, crash.AfterFence) {
			a.joined.result <- joinDied // the batch dies unfinished
			ran = slices.Delete(ran, i, i+1)
			again(nil)
			return
		}
	}
	if err := ackAll(ctx, ok); err != nil {
		again(nil)
		return
	}
	if err := tx.Commit(); err != nil {
		for _, a := range ran {
			a.joined.result <- joinAgain
		}
		return
	}
	if len(advanced) > 0 {
		g.known.committed(ok[0].consumer, advanced)
	}
	for _, a := range ran {
		if slices.Contains(ok, a) {
			a.joined.result <- joinCommitted
		} else {
			a.joined.result <- joinSettled
		}
	}
}

// beginJoined begins the transaction of batch, deferred attempts at
// their first statement, marks their events and locks their subjects'
// checkpoints in it (see markLockJoined), and returns it with its
// statement timeout and the attempts that run in it; a nil transaction
// when none does (each attempt is refused: it fails, or runs again
// alone). When the marks of attempts it refuses were made in it, it
// begins again without them: the batch's commit would keep those marks
// and lose their events, which would find them when they run again.
func (g *group) beginJoined(ctx context.Context, batch []*attemptRun) (tx *sqlx.Tx, timeout string, in []*attemptRun) {
	for len(batch) > 0 {
		var err error
		if tx, err = g.u.db.BeginTxx(ctx, nil); err != nil {
			refuse(batch, fmt.Errorf("begin: %w", err))
			return nil, "", nil
		}
		if timeout = g.timeout(batch); timeout != "" {
			if _, err := tx.ExecContext(ctx, timeout); err != nil {
				_ = tx.Rollback() // err is what matters
				refuse(batch, fmt.Errorf("statement timeout: %w", err))
				return nil, "", nil
			}
		}
		own := &Tx{tx: tx, ctx: context.WithoutCancel(ctx)}
		in, clean := g.markLockJoined(own.ctx, own, batch)
		switch {
		case clean && len(in) == 0:
			_ = tx.Rollback() // nothing to run
			return nil, "", nil
		case clean:
			return tx, timeout, in
		}
		_ = tx.Rollback() // the refused attempts' marks go with it
		batch = in
	}
	return nil, "", nil
}

// refuse keeps each of as, deferred attempts at their first statement,
// out of its batch, with err.
func refuse(as []*attemptRun, err error) {
	for _, a := range as {
		a.joined.grant <- joinGrant{err: err}
	}
}

// markLockJoined marks the events of batch and locks their subjects'
// checkpoints in own, the batch's transaction, and returns the attempts
// whose mark is new and checkpoint as they read it; it refuses the others
// (errDeferredLost), which run again alone, and so it does, before it
// marks, the events of a subject after its first in batch. It refuses
// each attempt of batch but those it returns, once: with the statement's
// error when it fails. clean is false when a refused attempt's mark was
// made in own: the caller then rolls own back, and runs the others in a
// transaction of their own.
func (g *group) markLockJoined(ctx context.Context, own *Tx, batch []*attemptRun) (in []*attemptRun, clean bool) {
	for _, a := range batch {
		if a.consumer != batch[0].consumer {
			refuse(batch, errDeferredLost) // one statement marks for one consumer: each runs alone
			return nil, true
		}
	}
	var (
		keys     = make([]framework.Key, 0, len(batch))
		subjects []string
		marking  = batch[:0:0]
	)
	for _, a := range batch {
		s := a.delivery.OrderedSubject
		if s != "" && slices.Contains(subjects, s) {
			// A second event of a subject in the batch read the
			// checkpoint the first one moves: it runs again alone,
			// after it, and is not marked here.
			refuse([]*attemptRun{a}, errDeferredLost)
			continue
		}
		if s != "" {
			subjects = append(subjects, s)
		}
		keys = append(keys, a.key)
		marking = append(marking, a)
	}
	var (
		first       []bool
		checkpoints map[string]int64
		err         error
	)
	if mc, ok := g.u.store.(markCheckpointer); ok && len(subjects) > 0 {
		first, checkpoints, err = mc.MarkCheckpointMany(ctx, own, batch[0].consumer, keys, subjects)
	} else {
		first, err = g.u.store.(manyMarker).MarkMany(ctx, own, batch[0].consumer, keys)
	}
	if err != nil {
		refuse(marking, fmt.Errorf("mark processed: %w", err))
		return nil, true
	}
	if checkpoints == nil && len(subjects) > 0 {
		if checkpoints, err = g.u.store.(orderBatcher).CheckpointMany(ctx, own, batch[0].consumer, subjects); err != nil {
			refuse(marking, fmt.Errorf("checkpoints of %d subjects: %w", len(subjects), err))
			return nil, true
		}
	}
	in, clean = make([]*attemptRun, 0, len(marking)), true
	for i, a := range marking {
		if s := a.delivery.OrderedSubject; !first[i] || s != "" && checkpoints[s] != a.joined.checkpoint {
			refuse([]*attemptRun{a}, errDeferredLost)
			clean = clean && !first[i] // its mark is own's
			continue
		}
		in = append(in, a)
	}
	return in, clean
}
