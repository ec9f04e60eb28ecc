package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// The statements a batch makes for all its attempts at once: the marks and
// the strict-order checkpoints before they run; the checkpoints' moves,
// the partitions' fences and the transport's acks before its commit.

// ackAll writes the transport's acks of the attempts of ok in their
// batch's transaction, one statement per TxAckBatch (a transport's
// subscription) instead of one per attempt.
func ackAll(ctx context.Context, ok []*attemptRun) error {
	var (
		batches []TxAckBatch
		items   = map[TxAckBatch][]any{}
	)
	for _, a := range ok {
		if !a.acking {
			continue
		}
		ack := a.delivery.Ack
		if _, seen := items[ack.Batch]; !seen {
			batches = append(batches, ack.Batch)
		}
		items[ack.Batch] = append(items[ack.Batch], ack.Item)
	}
	for _, b := range batches {
		if err := b.AckInTx(ctx, ok[0].tx, items[b]); err != nil {
			return err
		}
	}
	return nil
}

// fenceAll checks the partitions of the attempts of ok in their batch's
// transaction, one call per Fencer with the distinct partitions of its
// attempts, instead of one per attempt.
func fenceAll(ctx context.Context, ok []*attemptRun) error {
	var (
		fencers    []Fencer
		partitions = map[Fencer][]int{}
	)
	for _, a := range ok {
		if !a.fencing {
			continue
		}
		f, p := a.delivery.Fencer, a.delivery.Partition
		ps, seen := partitions[f]
		if !seen {
			fencers = append(fencers, f)
		}
		if !slices.Contains(ps, p) {
			partitions[f] = append(ps, p)
		}
	}
	for _, f := range fencers {
		if err := f.Fence(ctx, ok[0].tx, partitions[f]); err != nil {
			return fmt.Errorf("fence: %w", err)
		}
	}
	return nil
}

// manyMarker is a Store that marks many events in one statement (the SQL
// stores do).
type manyMarker interface {
	MarkMany(ctx context.Context, tx *Tx, consumer string, keys []framework.Key) ([]bool, error)
}

// markAll marks the events of batch, all of one consumer, in one statement
// when the store can: one round trip for the batch instead of one per
// attempt. Otherwise each attempt marks its own.
func (g *group) markAll(ctx context.Context, batch []*attemptRun) error {
	m, ok := g.u.store.(manyMarker)
	if !ok || g.u.withoutMark {
		return nil
	}
	keys := make([]framework.Key, len(batch))
	for i, a := range batch {
		if a.consumer != batch[0].consumer {
			return nil // one statement marks for one consumer
		}
		keys[i] = a.key
	}
	first, err := m.MarkMany(ctx, batch[0].tx, batch[0].consumer, keys)
	if err != nil {
		return err
	}
	for i, a := range batch {
		a.marked, a.first = true, first[i]
	}
	return nil
}

// orderBatcher is a Store that reads and locks the checkpoints of many
// subjects, and moves them, in one statement each (the PostgreSQL store
// does; see Delivery.OrderedSubject).
type orderBatcher interface {
	CheckpointMany(ctx context.Context, tx *Tx, consumer string, subjects []string) (map[string]int64, error)
	AdvanceMany(ctx context.Context, tx *Tx, consumer string, subjects []string, seqs []int64) (clear bool, err error)
}

// markCheckpointer is a Store that marks many events and reads and locks
// the checkpoints of many subjects in one round trip (the PostgreSQL
// store does).
type markCheckpointer interface {
	MarkCheckpointMany(ctx context.Context, tx *Tx, consumer string, keys []framework.Key, subjects []string) ([]bool, map[string]int64, error)
}

// markMover is a Store that marks many events, moves the checkpoints of
// some subjects from a checkpoint to another, each only if it is still at
// the first (a compare-and-set), and reads and locks the checkpoints of
// others, in one round trip (the PostgreSQL store does). moved reports
// that every move was made and that no wait, parked event or skip is
// after a move's from.
type markMover interface {
	MarkMoveMany(ctx context.Context, tx *Tx, consumer string, keys []framework.Key, lock, move []string, from, to []int64) (first []bool, checkpoints map[string]int64, moved bool, err error)
}

// plannedMoves are the checkpoint moves a batch made before its handlers
// ran (see knownCheckpoints), by subject: its attempts must take them,
// no more and no less (see advanceAll).
type plannedMoves map[string]int64

// markLock marks the events of batch (see markAll) and reads and locks
// the checkpoints of their strict-order subjects (see lockCheckpoints),
// in one round trip when the store can, and moves those of the subjects
// whose events are at their turn by the checkpoints this process
// committed (see planMoves) in the same round trip: a batch of
// strict-order events then costs its database the statements of an
// unordered one, and one more (the checkpoints' move, advanceAll) when it
// read one.
func (g *group) markLock(ctx context.Context, batch []*attemptRun) (map[string]int64, plannedMoves, error) {
	subjects := g.orderedSubjects(batch)
	if mm, ok := g.u.store.(markMover); ok && subjects != nil && !g.u.withoutMark {
		if planned, from, unknown := g.planMoves(batch, subjects); planned != nil {
			checkpoints, err := g.markMove(ctx, mm, batch, planned, from, unknown)
			return checkpoints, planned, err
		}
	}
	mc, ok := g.u.store.(markCheckpointer)
	if !ok || subjects == nil || g.u.withoutMark {
		if err := g.markAll(ctx, batch); err != nil {
			return nil, nil, err
		}
		checkpoints, err := g.lockCheckpoints(ctx, batch, subjects)
		return checkpoints, nil, err
	}
	first, checkpoints, err := mc.MarkCheckpointMany(ctx, batch[0].tx, batch[0].consumer, batchKeys(batch), subjects)
	if err != nil {
		return nil, nil, err
	}
	for i, a := range batch {
		a.marked, a.first = true, first[i]
	}
	orderSteps(batch)
	return checkpoints, nil, nil
}

// batchKeys returns the events of batch's attempts, one consumer's (see
// orderedSubjects).
func batchKeys(batch []*attemptRun) []framework.Key {
	keys := make([]framework.Key, len(batch))
	for i, a := range batch {
		keys[i] = a.key
	}
	return keys
}

// planMoves returns, of subjects (see orderedSubjects), the moves of the
// checkpoints of those whose first event in batch is at its turn by the
// checkpoint this process committed last (see knownCheckpoints): each to
// the last of the run of its events in batch that follow one another from
// it, as the batch's handlers will take them; the checkpoints they move
// from; and the other subjects, whose checkpoints the batch reads and
// locks. planned is nil when no subject is at its turn so.
func (g *group) planMoves(batch []*attemptRun, subjects []string) (planned, from plannedMoves, unknown []string) {
	// One pass over batch (a batch of cold subjects has as many subjects
	// as events): each subject's run, by its place in subjects.
	type run struct {
		c, to     int64
		first, at bool
	}
	runs := make([]run, len(subjects))
	place := make(map[string]int, len(subjects))
	for i, s := range subjects {
		place[s] = i
		runs[i].first = true
	}
	for _, a := range batch {
		i, ok := place[a.delivery.OrderedSubject]
		if !ok {
			continue
		}
		r, seq := &runs[i], a.delivery.OrderedSeq
		switch {
		case r.first:
			r.first = false
			if r.c, r.at = g.known.turn(a.consumer, subjects[i], seq); r.at {
				r.to = seq
			}
		case r.at && seq == r.to+1:
			r.to = seq
		}
	}
	for i, s := range subjects {
		r := runs[i]
		if !r.at {
			unknown = append(unknown, s)
			continue
		}
		if planned == nil {
			planned, from = plannedMoves{}, plannedMoves{}
		}
		planned[s], from[s] = r.to, r.c
	}
	return planned, from, unknown
}

// markMove marks the events of batch, moves the checkpoints of planned
// from those of from, and reads and locks those of unknown, in one round
// trip (see markMover). It returns the checkpoints the batch's attempts
// run at, from's and those read, and errOrderNotClear when a move was not
// made (another process moved a checkpoint since this one committed it)
// or a subject moved has a wait, a parked event or a skip after it.
func (g *group) markMove(ctx context.Context, mm markMover, batch []*attemptRun, planned, from plannedMoves, unknown []string) (map[string]int64, error) {
	move := slices.Sorted(maps.Keys(planned)) // two batches lock their rows in one order
	froms, tos := make([]int64, len(move)), make([]int64, len(move))
	for i, s := range move {
		froms[i], tos[i] = from[s], planned[s]
	}
	first, checkpoints, moved, err := mm.MarkMoveMany(ctx, batch[0].tx, batch[0].consumer, batchKeys(batch), unknown, move, froms, tos)
	if err != nil {
		return nil, err
	}
	if !moved {
		g.known.forget(batch[0].consumer, move)
		return nil, errOrderNotClear
	}
	for i, a := range batch {
		a.marked, a.first = true, first[i]
	}
	maps.Copy(checkpoints, from)
	orderSteps(batch)
	return checkpoints, nil
}

// errOrderNotClear ends a batch whose attempts' subjects have a wait, a
// parked event or a skip at or after their steps: each attempt runs again
// alone, and its strict-order step ends the wait or parks on its own.
var errOrderNotClear = errors.New("a subject of the batch has a wait, a parked event or a skip at or after its step")

// lockCheckpoints reads and locks, in one statement, the checkpoints of
// subjects, those of batch's attempts that keep strict order (see
// orderedSubjects), and gives each such attempt a strict-order step
// (a.order): the step then reads no checkpoint, and leaves the
// checkpoint's move to advanceAll. It returns the checkpoints by subject,
// which the batch moves as its attempts take effect one after the other
// (see moved), so that the second event of a subject in the batch sees
// the first one's move; nil when the attempts read their own (subjects
// nil).
func (g *group) lockCheckpoints(ctx context.Context, batch []*attemptRun, subjects []string) (map[string]int64, error) {
	if subjects == nil {
		return nil, nil
	}
	checkpoints, err := g.u.store.(orderBatcher).CheckpointMany(ctx, batch[0].tx, batch[0].consumer, subjects)
	if err != nil {
		return nil, fmt.Errorf("checkpoints of %d subjects: %w", len(subjects), err)
	}
	orderSteps(batch)
	return checkpoints, nil
}

// orderedSubjects returns the strict-order subjects of batch's attempts,
// whose checkpoints the batch reads and locks in one statement: nil when
// the attempts read their own (fewer than two such attempts, a store
// that cannot, SQLite, or attempts of more than one consumer, which one
// statement does not read).
func (g *group) orderedSubjects(batch []*attemptRun) []string {
	if _, ok := g.u.store.(orderBatcher); !ok || g.u.db.DriverName() != "pgx" {
		return nil
	}
	var (
		subjects []string
		ordered  int
		seen     map[string]struct{} // made at the first: most batches have none
	)
	for _, a := range batch {
		if a.consumer != batch[0].consumer {
			return nil
		}
		if s := a.delivery.OrderedSubject; s != "" {
			ordered++
			if seen == nil {
				seen = make(map[string]struct{}, len(batch))
			}
			if _, ok := seen[s]; !ok {
				seen[s] = struct{}{}
				subjects = append(subjects, s)
			}
		}
	}
	if ordered < 2 {
		return nil // one statement an attempt either way
	}
	return subjects
}

// orderSteps gives each attempt of batch on a strict-order subject its
// step (a.order), once the batch read and locked the checkpoints.
func orderSteps(batch []*attemptRun) {
	for _, a := range batch {
		if a.delivery.OrderedSubject != "" {
			a.order = &pipeline.OrderStep{}
		}
	}
}

// checkpoint hands a, about to run in its batch, its subject's checkpoint
// as the attempts before it in the batch left it (see lockCheckpoints).
func checkpoint(checkpoints map[string]int64, a *attemptRun) {
	if a.order != nil {
		a.order.Checkpoint = checkpoints[a.delivery.OrderedSubject]
	}
}

// moved moves the checkpoint of a's subject in checkpoints once a took
// effect at its turn, for the next attempt of the subject in the batch.
func moved(checkpoints map[string]int64, a *attemptRun) {
	if a.order != nil && a.order.Advance {
		checkpoints[a.delivery.OrderedSubject] = a.order.Seq
	}
}

// advanceAll moves, in one statement, the checkpoints of the attempts of
// ok whose strict-order step asked for it (pipeline.OrderStep.Advance),
// but those the batch moved before its handlers ran (planned), and
// returns every checkpoint moved, by subject, for knownCheckpoints once
// the batch commits. It returns errOrderNotClear when one of their
// subjects has a wait, a parked event or a skip at or after its step, or
// when the attempts did not take a planned move as planned (an event of
// the run was processed before, say).
func (g *group) advanceAll(ctx context.Context, ok []*attemptRun, planned plannedMoves) (map[string]int64, error) {
	var (
		subjects []string
		seqs     []int64
		advanced = map[string]int64{}
	)
	for _, a := range ok {
		if a.order == nil || !a.order.Advance {
			continue
		}
		s := a.delivery.OrderedSubject
		advanced[s] = max(advanced[s], a.order.Seq)
		if _, ok := planned[s]; !ok {
			subjects = append(subjects, s)
			seqs = append(seqs, a.order.Seq)
		}
	}
	for s, to := range planned {
		if advanced[s] != to {
			g.known.forget(ok[0].consumer, []string{s})
			return nil, errOrderNotClear
		}
	}
	if len(subjects) == 0 {
		return advanced, nil
	}
	clear, err := g.u.store.(orderBatcher).AdvanceMany(ctx, ok[0].tx, ok[0].consumer, subjects, seqs)
	switch {
	case err != nil:
		return nil, fmt.Errorf("advance %d checkpoints: %w", len(subjects), err)
	case !clear:
		return nil, errOrderNotClear
	}
	return advanced, nil
}
