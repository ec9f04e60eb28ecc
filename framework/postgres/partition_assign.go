package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/effectively-once/effectively/framework/driver"
)

// partitionedSubscriber is the subscriber of a partitioned consumer
// (driver.SubscribeConfig.Partitions above 1): a driver.Assigner, whose
// subscriptions read no partition until assigned.
type partitionedSubscriber struct {
	*subscriber
}

var _ driver.Assigner = partitionedSubscriber{}

// Assign makes every subscription of the subscriber, and those it starts
// later, read partitions and no other (driver.Assigner). A partition
// newly assigned is read once its lock is taken: at once, or once the
// process that read it before released it. Assign returns once no
// message of a partition it dropped is in flight any more (every one was
// acked or nacked), and its acknowledged position is written and its
// lock released, or when ctx ends, with ctx's error. A dropped partition
// is handed back as it is: its messages read and not acknowledged, and
// those nacked, are the next owner's to deliver.
func (s partitionedSubscriber) Assign(ctx context.Context, partitions []int) error {
	parts := slices.Clone(partitions)
	slices.Sort(parts)
	parts = slices.Compact(parts)
	for _, p := range parts {
		if p < 0 || p >= s.partitions {
			return fmt.Errorf("postgres: assign consumer %s: partition %d: must be between 0 and %d", s.group, p, s.partitions-1)
		}
	}
	s.assignMu.Lock()
	defer s.assignMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if len(parts) == 0 {
			return nil
		}
		return errClosed
	}
	s.assigned = parts
	subs := make([]*subscription, 0, len(s.running))
	for sub := range s.running {
		subs = append(subs, sub)
	}
	s.mu.Unlock()
	dones := make([]chan struct{}, len(subs))
	for i, sub := range subs {
		a := assignment{parts: parts, done: make(chan struct{})}
		select {
		case sub.assign <- a:
			dones[i] = a.done
		case <-sub.finished:
		case <-ctx.Done():
			return fmt.Errorf("postgres: assign consumer %s: %w", s.group, ctx.Err())
		}
	}
	for i, done := range dones {
		if done == nil {
			continue
		}
		select {
		case <-done:
		case <-subs[i].finished:
		case <-ctx.Done():
			return fmt.Errorf("postgres: assign consumer %s: %w", s.group, ctx.Err())
		}
	}
	return nil
}

// initializePartitions gives topic's messages table the bucket column,
// the bucket function and the index of the subscriber's partition count.
// An index that cannot be built is logged once per topic: the partitions
// are then read through the primary key, filtering the other partitions'
// rows out.
func (s *subscriber) initializePartitions(ctx context.Context, topic string) error {
	if err := ensureBucket(ctx, s.db, s.cfg, topic, true); err != nil {
		return fmt.Errorf("initialize %s: %w", topic, err)
	}
	err := ensureIndex(ctx, s.db, s.cfg, topic, s.partitions, s.log)
	if err == nil || s.base.Err() != nil || ctx.Err() != nil {
		return nil
	}
	s.mu.Lock()
	warned := s.noIndex[topic]
	s.noIndex[topic] = true
	s.mu.Unlock()
	if !warned {
		s.log.Warn("postgres subscriber: could not build the partitions' index; partitions are read without it, filtering the others' rows",
			slog.String("topic", topic), slog.Int("partitions", s.partitions), slog.Any("error", err),
			slog.String("statement", bucketIndexSQL(s.cfg.TablePrefix, topic, s.partitions)))
	}
	return nil
}
