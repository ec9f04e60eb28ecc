package driver

import (
	"context"
	"errors"
	"fmt"
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

// errOrderNotClear ends a batch whose attempts' subjects have a wait, a
// parked event or a skip at or after their steps: each attempt runs again
// alone, and its strict-order step ends the wait or parks on its own.
var errOrderNotClear = errors.New("a subject of the batch has a wait, a parked event or a skip at or after its step")

// lockCheckpoints reads and locks, in one statement, the checkpoints of
// the subjects of batch's attempts that keep strict order, on PostgreSQL
// when the store can, and gives each such attempt a strict-order step
// (a.order): the step then reads no checkpoint, and leaves the
// checkpoint's move to advanceAll. It returns the checkpoints by subject,
// which the batch moves as its attempts take effect one after the other
// (see nextCheckpoint), so that the second event of a subject in the
// batch sees the first one's move; nil when the attempts read their own.
func (g *group) lockCheckpoints(ctx context.Context, batch []*attemptRun) (map[string]int64, error) {
	ob, ok := g.u.store.(orderBatcher)
	if !ok || g.u.db.DriverName() != "pgx" {
		return nil, nil
	}
	var (
		subjects []string
		ordered  int
	)
	for _, a := range batch {
		if s := a.delivery.OrderedSubject; s != "" {
			if a.consumer != batch[0].consumer {
				return nil, nil // one statement reads one consumer's
			}
			ordered++
			if !slices.Contains(subjects, s) {
				subjects = append(subjects, s)
			}
		}
	}
	if ordered < 2 {
		return nil, nil // one statement an attempt either way
	}
	checkpoints, err := ob.CheckpointMany(ctx, batch[0].tx, batch[0].consumer, subjects)
	if err != nil {
		return nil, fmt.Errorf("checkpoints of %d subjects: %w", len(subjects), err)
	}
	for _, a := range batch {
		if a.delivery.OrderedSubject != "" {
			a.order = &pipeline.OrderStep{}
		}
	}
	return checkpoints, nil
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
// and returns errOrderNotClear when one of their subjects has a wait, a
// parked event or a skip at or after its step.
func (g *group) advanceAll(ctx context.Context, ok []*attemptRun) error {
	var (
		subjects []string
		seqs     []int64
	)
	for _, a := range ok {
		if a.order != nil && a.order.Advance {
			subjects = append(subjects, a.delivery.OrderedSubject)
			seqs = append(seqs, a.order.Seq)
		}
	}
	if len(subjects) == 0 {
		return nil
	}
	clear, err := g.u.store.(orderBatcher).AdvanceMany(ctx, ok[0].tx, ok[0].consumer, subjects, seqs)
	switch {
	case err != nil:
		return fmt.Errorf("advance %d checkpoints: %w", len(subjects), err)
	case !clear:
		return errOrderNotClear
	}
	return nil
}
