package memory

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

var _ driver.Inspector = (*Store)(nil)

// InspectEvent returns what the store knows of the event key: the
// committed processed marks, its dead letters with their history, its
// holds and parkings, and how far PurgeProcessed deleted. The memory
// store has no outbox: Outbox is nil.
func (s *Store) InspectEvent(ctx context.Context, key framework.Key) (driver.EventRecord, error) {
	if err := ctx.Err(); err != nil {
		return driver.EventRecord{}, fmt.Errorf("inspect event %s: %w", key, err)
	}
	rec := driver.EventRecord{Key: key}
	var ids []int64
	s.mu.Lock()
	for k, m := range s.marks {
		if k.key == key && m.committed {
			rec.Processed = append(rec.Processed, driver.ProcessedMark{Consumer: k.consumer, At: m.at.UTC()})
		}
	}
	for k, id := range s.byKey {
		if k.key == key {
			ids = append(ids, id)
		}
	}
	for k, p := range s.parked {
		if p.Key != key {
			continue
		}
		var c int64
		if cp, ok := s.checkpoints[k.subjectKey]; ok {
			c = cp.seq
		}
		p.Ready = !p.Held && p.Seq == c+1
		p.Topic, p.Body, p.Metadata = "", nil, nil
		rec.Parked = append(rec.Parked, p)
	}
	rec.Horizons.Processed = s.purgedBefore
	s.mu.Unlock()

	slices.SortFunc(rec.Processed, func(a, b driver.ProcessedMark) int { return cmp.Compare(a.Consumer, b.Consumer) })
	slices.SortFunc(rec.Parked, func(a, b driver.ParkedEvent) int {
		return cmp.Or(cmp.Compare(a.Consumer, b.Consumer), cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Seq, b.Seq))
	})
	slices.Sort(ids)
	for _, id := range ids {
		dl, err := s.DeadLetter(ctx, id)
		if err != nil {
			return rec, fmt.Errorf("inspect event %s: %w", key, err)
		}
		h, err := s.DeadLetterHistory(ctx, id)
		if err != nil {
			return rec, fmt.Errorf("inspect event %s: %w", key, err)
		}
		rec.DeadLetters = append(rec.DeadLetters, driver.DeadLetterRecord{DeadLetter: dl, History: h})
	}
	return rec, nil
}

// InspectConsumers returns, per consumer, the committed marks made at or
// after since, the pending dead letters and the parked events. The
// memory store has no outbox: no unsent row.
func (s *Store) InspectConsumers(ctx context.Context, since time.Time) (driver.ConsumersRecord, error) {
	if err := ctx.Err(); err != nil {
		return driver.ConsumersRecord{}, fmt.Errorf("inspect consumers: %w", err)
	}
	figures := make(map[string]*driver.ConsumerFigures)
	of := func(consumer string) *driver.ConsumerFigures {
		f := figures[consumer]
		if f == nil {
			f = &driver.ConsumerFigures{Consumer: consumer}
			figures[consumer] = f
		}
		return f
	}
	s.mu.Lock()
	for k, m := range s.marks {
		if m.committed && !m.at.Before(since) {
			of(k.consumer).Processed++
		}
	}
	for _, dl := range s.deadLetters {
		if dl.Status == driver.DeadLetterPending {
			of(dl.Consumer).PendingDeadLetters++
		}
	}
	for _, p := range s.parked {
		if !p.Held {
			of(p.Consumer).Parked++
		}
	}
	s.mu.Unlock()
	var rec driver.ConsumersRecord
	for _, f := range figures {
		rec.Consumers = append(rec.Consumers, *f)
	}
	slices.SortFunc(rec.Consumers, func(a, b driver.ConsumerFigures) int { return cmp.Compare(a.Consumer, b.Consumer) })
	return rec, nil
}
