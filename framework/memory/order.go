package memory

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
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
	holder *driver.Tx
	free   chan struct{} // closed when holder ends
}

// view returns the checkpoint as the attempt tx sees it.
func (c *checkpoint) view(tx *driver.Tx) int64 {
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

// wait is the wait of the sequence of a waitKey (WaitGap): since when,
// and by which event, the first to wait there.
type wait struct {
	since time.Time
	key   framework.Key
}

// hold makes tx the holder of the checkpoint of k, waiting while another
// attempt holds it, and returns it. The hold ends with tx.
func (s *Store) hold(ctx context.Context, tx *driver.Tx, k subjectKey) (*checkpoint, error) {
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
func (s *Store) Checkpoint(ctx context.Context, tx *driver.Tx, consumer, subject string) (int64, error) {
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
func (s *Store) Advance(ctx context.Context, tx *driver.Tx, consumer, subject string, seq int64) (bool, error) {
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
// the store's clock. The event's delivery count is set to zero. It waits
// while an attempt holds the subject's checkpoint, as the SQL stores' row
// lock does, and records nothing once the checkpoint is at seq or past
// it.
func (s *Store) WaitGap(ctx context.Context, consumer, subject string, seq int64, key framework.Key, _ []byte) (time.Duration, error) {
	sk := subjectKey{consumer, subject}
	var waited time.Duration
	err := s.whenFree(ctx, sk, func(c *checkpoint) {
		if c != nil && c.seq >= seq {
			return // it took effect: its wait ended
		}
		k := waitKey{sk, seq}
		w, ok := s.waits[k]
		since := w.since
		if p, parked := s.parked[k]; !ok && parked && !p.Held {
			since, ok = p.At, true // as the SQL stores' one row of the event
		}
		if !ok {
			since = s.now()
			s.waits[k] = wait{since: since, key: key} // the first waiter's, as the row
		}
		s.deliveries[markKey{consumer: consumer, key: key}] = 0 // its redelivery counts as the first
		waited = s.now().Sub(since)
	})
	if err != nil {
		return 0, fmt.Errorf("wait gap of %s for %s: %w", key, consumer, err)
	}
	return waited, nil
}

// whenFree runs f under s.mu once no attempt holds the checkpoint of k,
// waiting meanwhile as a statement waits for the SQL stores' row lock; c
// is the checkpoint, nil when k has none.
func (s *Store) whenFree(ctx context.Context, k subjectKey, f func(c *checkpoint)) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.mu.Lock()
		c := s.checkpoints[k]
		if c == nil || c.holder == nil {
			f(c)
			s.mu.Unlock()
			return nil
		}
		free := c.free
		s.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
		}
	}
}

// EndWait removes the wait, hold or parking of (consumer, subject, seq):
// when tx commits, or at once when tx is nil; when tx commits, the
// checkpoint also moves past the discarded dead letters right after it
// (see Skip). It reports whether events of the subject are parked after
// seq.
func (s *Store) EndWait(ctx context.Context, tx *driver.Tx, consumer, subject string, seq int64, key framework.Key) (bool, error) {
	k := waitKey{subjectKey{consumer, subject}, seq}
	s.mu.Lock()
	taken := s.taken(k, key)
	s.mu.Unlock()
	if taken {
		return false, fmt.Errorf("end the wait of %s #%d for %s: %w", subject, seq, consumer, driver.ErrSequenceTaken)
	}
	end := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.waits, k)
		delete(s.parked, k)
		if tx != nil {
			s.skipPast(k.subjectKey)
		}
	}
	if tx == nil {
		end()
		return false, nil
	}
	tx.OnCommit(end)
	s.mu.Lock()
	defer s.mu.Unlock()
	for pk, p := range s.parked {
		if pk.subjectKey == k.subjectKey && pk.seq > seq && !p.Held {
			return true, nil
		}
	}
	return false, nil
}

// holdSubject records that the event key, with sequence seq of subject,
// is a dead letter that the later events of its subject wait behind,
// unless the subject's checkpoint is at or past seq. s.mu is held.
func (s *Store) holdSubject(consumer, subject string, seq int64, key framework.Key) {
	sk := subjectKey{consumer, subject}
	if c, ok := s.checkpoints[sk]; ok && c.seq >= seq {
		return
	}
	if s.taken(waitKey{sk, seq}, key) {
		return // another event's place: its dead letter alone is stored
	}
	s.parked[waitKey{sk, seq}] = driver.ParkedEvent{
		Consumer: consumer, Subject: subject, Seq: seq, Key: key, At: s.now(), Held: true,
	}
	delete(s.skipped, waitKey{sk, seq}) // a repeat holds the subject again
}

// taken reports whether another event than key holds k: parked, held or
// skipped (see driver.ErrSequenceTaken). s.mu is held.
func (s *Store) taken(k waitKey, key framework.Key) bool {
	if p, ok := s.parked[k]; ok && p.Key != key {
		return true
	}
	skipped, ok := s.skipped[k]
	return ok && skipped != key
}

// endOwnWait ends the wait or parking of the event key, with sequence seq
// of subject, as its dead letter is stored. s.mu is held.
func (s *Store) endOwnWait(consumer, subject string, seq int64, key framework.Key) {
	k := waitKey{subjectKey{consumer, subject}, seq}
	if p, ok := s.parked[k]; ok && !p.Held && p.Key == key {
		delete(s.parked, k)
	}
	delete(s.waits, k)
}

// Park parks p when tx commits, if an event of its subject between the
// checkpoint (as tx sees it) and p.Seq is held or parked, and reports
// whether it does. The processed mark that tx made for p.Key goes when
// tx commits.
func (s *Store) Park(ctx context.Context, tx *driver.Tx, p driver.ParkedEvent) (bool, error) {
	if tx == nil {
		return false, fmt.Errorf("park %s #%d for %s: %w", p.Subject, p.Seq, p.Consumer, ErrNoTx)
	}
	sk := subjectKey{p.Consumer, p.Subject}
	s.mu.Lock()
	defer s.mu.Unlock()
	var c int64
	if cp, ok := s.checkpoints[sk]; ok {
		c = cp.view(tx)
	}
	blocked := false
	for pk := range s.parked {
		if pk.subjectKey == sk && pk.seq > c && pk.seq < p.Seq {
			blocked = true
			break
		}
	}
	if !blocked {
		return false, nil
	}
	if s.taken(waitKey{sk, p.Seq}, p.Key) {
		return false, fmt.Errorf("park %s #%d for %s: %w", p.Subject, p.Seq, p.Consumer, driver.ErrSequenceTaken)
	}
	p.At, p.Held, p.Ready = s.now(), false, false
	p.Body = slices.Clone(p.Body)
	p.Metadata = driver.StorableMetadata(p.Metadata)
	mk := markKey{consumer: p.Consumer, key: p.Key}
	tx.OnCommit(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		k := waitKey{sk, p.Seq}
		s.parked[k] = p
		delete(s.waits, k)
		delete(s.skipped, k) // its own: replaced, as a row is
		if m, ok := s.marks[mk]; ok && m.tx == tx {
			delete(s.marks, mk)
		}
	})
	return true, nil
}

// ParkGap parks p, which waits (WaitGap), with its wait's start as its
// time, unless its turn came: it waits while an attempt holds the
// subject's checkpoint, as the SQL stores' row lock does, and reports
// false when the checkpoint is at p.Seq-1 or past it, or p does not wait.
func (s *Store) ParkGap(ctx context.Context, p driver.ParkedEvent) (bool, error) {
	sk := subjectKey{p.Consumer, p.Subject}
	var parked, taken bool
	err := s.whenFree(ctx, sk, func(c *checkpoint) {
		k := waitKey{sk, p.Seq}
		if c != nil && c.seq >= p.Seq-1 {
			return // its turn came
		}
		if taken = s.taken(k, p.Key); taken {
			return
		}
		w, waits := s.waits[k]
		since, waits := w.since, waits && w.key == p.Key
		if old, ok := s.parked[k]; ok && !old.Held && old.Key == p.Key {
			since, waits = old.At, true
		}
		if !waits {
			return
		}
		p.At, p.Held, p.Ready = since, false, false
		p.Body = slices.Clone(p.Body)
		p.Metadata = driver.StorableMetadata(p.Metadata)
		s.parked[k] = p
		parked = true
	})
	if err == nil && taken {
		err = driver.ErrSequenceTaken
	}
	if err != nil {
		return false, fmt.Errorf("park %s #%d for %s behind a gap: %w", p.Subject, p.Seq, p.Consumer, err)
	}
	return parked, nil
}

// Parked lists the held and parked events that match f, by consumer,
// subject and sequence.
func (s *Store) Parked(ctx context.Context, f driver.ParkedFilter) ([]driver.ParkedEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list parked events: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []driver.ParkedEvent
	for k, p := range s.parked {
		if f.Consumer != "" && k.consumer != f.Consumer || f.Subject != "" && k.subject != f.Subject {
			continue
		}
		var c int64
		if cp, ok := s.checkpoints[k.subjectKey]; ok {
			c = cp.seq
		}
		p.Ready = !p.Held && p.Seq == c+1
		if f.Ready && !p.Ready {
			continue
		}
		p.Body = slices.Clone(p.Body)
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b driver.ParkedEvent) int {
		return cmp.Or(cmp.Compare(a.Consumer, b.Consumer), cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Seq, b.Seq))
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// Skip ends the hold of the dead letter key of (consumer, subject). When
// its turn has come, the subject's checkpoint moves to its sequence;
// otherwise the checkpoint moves past it once the event before it took
// effect (see EndWait), so that no other event is skipped. It returns
// the sequence, or driver.ErrNotFound.
func (s *Store) Skip(ctx context.Context, consumer, subject string, key framework.Key) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("skip %s of %s for %s: %w", key, subject, consumer, err)
	}
	sk := subjectKey{consumer, subject}
	var (
		seq   int64
		found bool
	)
	err := s.whenFree(ctx, sk, func(*checkpoint) {
		for k, p := range s.parked {
			if k.subjectKey != sk || !p.Held || p.Key != key {
				continue
			}
			delete(s.parked, k)
			seq, found = k.seq, true
			c, ok := s.checkpoints[sk]
			if !ok {
				c = &checkpoint{}
				s.checkpoints[sk] = c
			}
			if k.seq-1 > c.seq {
				s.skipped[k] = key
				return
			}
			c.seq = max(c.seq, k.seq)
			s.skipPast(sk)
			return
		}
	})
	if err != nil {
		return 0, fmt.Errorf("skip %s of %s for %s: %w", key, subject, consumer, err)
	}
	if !found {
		return 0, fmt.Errorf("skip %s of %s for %s: not held: %w", key, subject, consumer, driver.ErrNotFound)
	}
	return seq, nil
}

// skipPast moves the committed checkpoint of sk past the skips (see
// Skip) right after it. s.mu is held.
func (s *Store) skipPast(sk subjectKey) {
	c, ok := s.checkpoints[sk]
	if !ok {
		return
	}
	for {
		k := waitKey{sk, c.seq + 1}
		if c.seq == math.MaxInt64 {
			return
		}
		if _, ok := s.skipped[k]; !ok {
			return
		}
		delete(s.skipped, k)
		c.seq++
	}
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
	if len(old) > 0 && before.After(s.purgedBefore) {
		s.purgedBefore = before.UTC()
	}
	return int64(len(old)), nil
}

// Adopt gives consumer the committed marks, with their times, and the
// committed subject checkpoints of the consumer named from, and moves to
// it the delivery counts, the dead letters and the unsent replays of
// from, at once; it returns how many marks it adopted. Marks consumer has
// are kept; a checkpoint keeps the higher sequence; counts of one event
// add up. Each dead letter moved records the adoption in its history (By
// is from); when consumer has a dead letter of the same event, that one
// is kept and takes the other's history and repeats (see the SQL
// stores). The waits, holds, parked events and skips move as
// adoptParked says. Running it again adopts only what is new.
func (s *Store) Adopt(ctx context.Context, consumer, from string) (int64, error) {
	if consumer == from {
		return 0, fmt.Errorf("adopt %s: a consumer cannot adopt its own name", from)
	}
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
	s.adoptParked(consumer, from, s.now().UTC())
	s.adoptDeadLetters(consumer, from)
	return n, nil
}

// adoptParked moves the waits, holds, parkings and skips of from to
// consumer, at now, as the SQL stores do. Where consumer has a place of
// the same subject and sequence, its own stays, unless it is a wait (no
// one's place) and from's is not. A parked event of from kept out by
// consumer's parking, hold or skip of another event is the only copy of
// its message: it becomes a dead letter of from (CodeSequenceConflict,
// holding nothing), which the adoption of the dead letters, after it,
// moves to consumer.
func (s *Store) adoptParked(consumer, from string, now time.Time) {
	to := func(k waitKey) waitKey { return waitKey{subjectKey{consumer, k.subject}, k.seq} }
	// Who holds each place of consumer, and whether it is a wait.
	type place struct {
		key  framework.Key
		wait bool
	}
	own := make(map[waitKey]place)
	for k, w := range s.waits {
		if k.consumer == consumer {
			own[k] = place{w.key, true}
		}
	}
	for k, p := range s.parked {
		if k.consumer == consumer {
			own[k] = place{key: p.Key}
		}
	}
	for k, key := range s.skipped {
		if k.consumer == consumer {
			own[k] = place{key: key}
		}
	}
	// claim reports whether from's place at k, not a wait, goes to
	// consumer: consumer has none there, or only a wait, which it ends.
	claim := func(k waitKey) bool {
		p, ok := own[to(k)]
		if ok && p.wait {
			delete(s.waits, to(k))
		}
		return !ok || p.wait
	}
	for k, p := range s.parked {
		if k.consumer != from {
			continue
		}
		delete(s.parked, k)
		switch {
		case claim(k):
			p.Consumer = consumer
			s.parked[to(k)] = p
		case !p.Held && own[to(k)].key != p.Key:
			s.putDeadLetter(p.DeadLetter(framework.CodeSequenceConflict, now), now)
		}
	}
	for k, key := range s.skipped {
		if k.consumer != from {
			continue
		}
		delete(s.skipped, k)
		if claim(k) {
			s.skipped[to(k)] = key
		}
	}
	for k, w := range s.waits {
		if k.consumer != from {
			continue
		}
		delete(s.waits, k)
		if _, ok := own[to(k)]; !ok {
			s.waits[to(k)] = w
		}
	}
}
