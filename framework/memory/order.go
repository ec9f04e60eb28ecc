package memory

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/effectively-once/effectively/framework"
)

// subjectKey keys a consumer's checkpoint of one subject.
type subjectKey struct {
	consumer, subject string
}

// checkpoint is a subject's sequence that took effect last, and the
// attempt that holds it until its transaction ends.
type checkpoint struct {
	seq    int64
	holder *framework.Tx
	free   chan struct{} // closed when holder ends
}

// waitKey keys an event that waits behind a gap of its subject.
type waitKey struct {
	subjectKey
	seq int64
}

// hold makes tx the holder of the checkpoint of k, waiting while another
// attempt holds it, and returns it. The hold ends with tx.
func (s *Store) hold(ctx context.Context, tx *framework.Tx, k subjectKey) (*checkpoint, error) {
	if tx == nil {
		return nil, fmt.Errorf("checkpoint %s of %s: %w", k.subject, k.consumer, ErrNoTx)
	}
	for {
		s.mu.Lock()
		c, ok := s.checkpoints[k]
		if !ok {
			c = &checkpoint{}
			s.checkpoints[k] = c
		}
		if c.holder == nil || c.holder == tx {
			if c.holder == nil {
				c.holder, c.free = tx, make(chan struct{})
				release := func() {
					s.mu.Lock()
					defer s.mu.Unlock()
					c.holder = nil
					close(c.free)
				}
				tx.OnCommit(release)
				tx.OnRollback(release)
			}
			s.mu.Unlock()
			return c, nil
		}
		free := c.free
		s.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return nil, fmt.Errorf("checkpoint %s of %s: %w", k.subject, k.consumer, ctx.Err())
		}
	}
}

// Checkpoint returns the sequence of (consumer, subject) that took effect
// last, 0 when none did, and holds it for tx until tx ends: attempts on
// one subject take turns.
func (s *Store) Checkpoint(ctx context.Context, tx *framework.Tx, consumer, subject string) (int64, error) {
	c, err := s.hold(ctx, tx, subjectKey{consumer, subject})
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return c.seq, nil
}

// Advance moves the checkpoint of (consumer, subject) to seq when tx
// commits, if seq is greater, and reports whether it moves. A concurrent
// attempt on the same subject waits until tx ends.
func (s *Store) Advance(ctx context.Context, tx *framework.Tx, consumer, subject string, seq int64) (bool, error) {
	c, err := s.hold(ctx, tx, subjectKey{consumer, subject})
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq <= c.seq {
		return false, nil
	}
	old := c.seq
	c.seq = seq // only tx sees it until it ends: tx holds the checkpoint
	tx.OnRollback(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.seq == seq {
			c.seq = old
		}
	})
	return true, nil
}

// WaitGap records that the event key with sequence seq waits for an
// earlier one of its subject, and returns for how long it has waited by
// the store's clock. The event's delivery count is forgotten.
func (s *Store) WaitGap(ctx context.Context, consumer, subject string, seq int64, key framework.Key, _ []byte) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("wait gap of %s for %s: %w", key, consumer, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := waitKey{subjectKey{consumer, subject}, seq}
	since, ok := s.waits[k]
	if !ok {
		since = s.now()
		s.waits[k] = since
	}
	delete(s.deliveries, markKey{consumer: consumer, key: key})
	return s.now().Sub(since), nil
}

// EndWait removes the wait of (consumer, subject, seq): when tx commits,
// or at once when tx is nil.
func (s *Store) EndWait(ctx context.Context, tx *framework.Tx, consumer, subject string, seq int64) error {
	end := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.waits, waitKey{subjectKey{consumer, subject}, seq})
	}
	if tx == nil {
		end()
		return nil
	}
	tx.OnCommit(end)
	return nil
}

// PurgeProcessed deletes up to limit of the oldest committed marks made
// before before, and returns how many it deleted.
func (s *Store) PurgeProcessed(ctx context.Context, before time.Time, limit int) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("purge processed marks: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var old []markKey
	for k, m := range s.marks {
		if m.committed && m.at.Before(before) {
			old = append(old, k)
		}
	}
	slices.SortFunc(old, func(a, b markKey) int { return s.marks[a].at.Compare(s.marks[b].at) })
	var n int64
	for _, k := range old {
		if limit > 0 && n == int64(limit) {
			break
		}
		delete(s.marks, k)
		n++
	}
	return n, nil
}

// Adopt gives consumer the committed marks and the subject checkpoints of
// the consumer named from, and returns how many marks it adopted. Running
// it again adopts only what is new.
func (s *Store) Adopt(ctx context.Context, consumer, from string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("adopt %s into %s: %w", from, consumer, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for k, m := range s.marks {
		if k.consumer != from || !m.committed {
			continue
		}
		nk := markKey{consumer: consumer, key: k.key}
		if _, ok := s.marks[nk]; ok {
			continue
		}
		done := make(chan struct{})
		close(done)
		s.marks[nk] = &mark{committed: true, done: done, at: m.at}
		n++
	}
	for k, c := range s.checkpoints {
		if k.consumer != from {
			continue
		}
		nk := subjectKey{consumer, k.subject}
		if own, ok := s.checkpoints[nk]; !ok {
			s.checkpoints[nk] = &checkpoint{seq: c.seq}
		} else if own.seq < c.seq && own.holder == nil {
			own.seq = c.seq
		}
	}
	return n, nil
}
