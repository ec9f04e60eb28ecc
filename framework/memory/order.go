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
// attempt that holds it until its transaction ends. The holder's Advance
// sets next, which takes effect when the holder commits: until then only
// the holder sees it, as a database transaction sees its own writes.
type checkpoint struct {
	seq    int64
	next   int64 // the holder's advance; 0 when none
	holder *framework.Tx
	free   chan struct{} // closed when holder ends
}

// view returns the checkpoint as the attempt tx sees it.
func (c *checkpoint) view(tx *framework.Tx) int64 {
	if c.holder == tx {
		return max(c.seq, c.next)
	}
	return c.seq
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
				tx.OnCommit(func() { s.release(c, true) })
				tx.OnRollback(func() { s.release(c, false) })
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

// release ends the hold of c: the holder's advance takes effect when it
// committed, and the next attempt on the subject may take the hold.
func (s *Store) release(c *checkpoint, committed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if committed {
		c.seq = max(c.seq, c.next)
	}
	c.next, c.holder = 0, nil
	close(c.free)
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
	return c.view(tx), nil
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
	if seq <= c.view(tx) {
		return false, nil
	}
	c.next = seq // takes effect when tx commits (see release)
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
// before before, by the store's clock, and returns how many it deleted.
// A limit of 0 deletes none.
func (s *Store) PurgeProcessed(ctx context.Context, before time.Time, limit int) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("purge processed marks: %w", err)
	}
	if limit < 0 {
		return 0, fmt.Errorf("purge processed marks: negative limit %d", limit)
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
	old = old[:min(len(old), limit)]
	for _, k := range old {
		delete(s.marks, k)
	}
	return int64(len(old)), nil
}

// Adopt gives consumer the committed marks, with their times, and the
// committed subject checkpoints of the consumer named from, and returns
// how many marks it adopted. Marks consumer has are kept; a checkpoint
// keeps the higher sequence. Running it again adopts only what is new.
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
		own, ok := s.checkpoints[nk]
		if !ok {
			own = &checkpoint{}
			s.checkpoints[nk] = own
		}
		own.seq = max(own.seq, c.seq) // a holder's advance of own applies on top
	}
	return n, nil
}
