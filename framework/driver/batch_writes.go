package driver

import (
	"context"
	"fmt"
	"slices"

	"github.com/effectively-once/effectively/framework"
)

// The writes a batch makes for all its attempts at once, before its
// commit: the marks, the partitions' fences, the transport's acks.

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
