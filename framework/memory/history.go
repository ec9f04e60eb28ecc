package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
)

// historyEntry is an entry of a dead letter's history and its place in
// the order the store wrote entries, which orders a merged history.
type historyEntry struct {
	seq int64
	driver.HistoryEntry
}

// storedReplay is a recorded Replay and its relay's state.
type storedReplay struct {
	driver.Replay
	sent         bool
	claimedUntil time.Time
}

// appendHistory appends e to the history of the dead letter id. The
// caller holds s.mu.
func (s *Store) appendHistory(id int64, e driver.HistoryEntry) {
	s.historySeq++
	s.history[id] = append(s.history[id], historyEntry{seq: s.historySeq, HistoryEntry: e})
}

// DeadLetterHistory returns every failure and resolution of the dead
// letter id in the order they were recorded, or an error wrapping
// driver.ErrNotFound when there is no dead letter id.
func (s *Store) DeadLetterHistory(ctx context.Context, id int64) ([]driver.HistoryEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("history of dead letter %d: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.history[id]
	if len(h) == 0 {
		return nil, fmt.Errorf("history of dead letter %d: %w", id, driver.ErrNotFound)
	}
	out := make([]driver.HistoryEntry, len(h))
	for i, e := range h {
		out[i] = e.HistoryEntry
	}
	return out, nil
}

// AddReplays records rs, each a replay of its own, at once.
func (s *Store) AddReplays(ctx context.Context, rs []driver.Replay) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("add %d replays: %w", len(rs), err)
	}
	for _, r := range rs {
		if r.Consumer == "" {
			return errors.New("add replay: Consumer is empty")
		}
	}
	now := s.now().UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		s.addReplay(r, now)
	}
	return nil
}

// addReplay records r, created at at. The caller holds s.mu.
func (s *Store) addReplay(r driver.Replay, at time.Time) {
	s.lastReplay++
	r.ID, r.CreatedAt = s.lastReplay, at
	r.Body = slices.Clone(r.Body)
	if r.Body == nil {
		r.Body = []byte{}
	}
	r.Metadata = driver.StorableMetadata(r.Metadata)
	if len(r.Metadata) == 0 {
		r.Metadata = nil
	}
	s.replays[r.ID] = &storedReplay{Replay: r}
}

// ClaimReplays takes a lease until now+lease, by the store's clock, on up
// to limit of the oldest unsent replays whose lease ended, as many as fit
// in driver.ReplayClaimBytes (the first whatever its size), and
// returns them by ascending ID.
func (s *Store) ClaimReplays(ctx context.Context, limit int, lease time.Duration) ([]driver.Replay, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("claim replays: limit %d, want at least 1", limit)
	}
	if lease <= 0 {
		return nil, fmt.Errorf("claim replays: lease %s, want more than 0", lease)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("claim replays: %w", err)
	}
	now := s.now().UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		out   []driver.Replay
		bytes int
	)
	for _, id := range slices.Sorted(maps.Keys(s.replays)) {
		r := s.replays[id]
		if r.sent || !r.claimedUntil.Before(now) { // leased until now or later
			continue
		}
		if bytes += len(r.Body); len(out) > 0 && bytes > driver.ReplayClaimBytes {
			break
		}
		r.claimedUntil = now.Add(lease)
		c := r.Replay
		c.Body, c.Metadata = slices.Clone(r.Body), maps.Clone(r.Metadata)
		out = append(out, c)
		if len(out) == limit {
			break
		}
	}
	slices.SortFunc(out, func(a, b driver.Replay) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// ReplaySent records that the replay id was published; an unknown id is
// an error wrapping driver.ErrNotFound.
func (s *Store) ReplaySent(ctx context.Context, id int64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mark replay %d sent: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.replays[id]
	if !ok {
		return fmt.Errorf("mark replay %d sent: %w", id, driver.ErrNotFound)
	}
	r.sent = true
	return nil
}

// adoptDeadLetters moves the delivery counts, dead letters and unsent
// replays of from to consumer, as the SQL stores do (see Adopt). The
// caller holds s.mu.
func (s *Store) adoptDeadLetters(consumer, from string) {
	for k, n := range s.deliveries {
		if k.consumer == from {
			s.deliveries[markKey{consumer: consumer, key: k.key}] += n
			delete(s.deliveries, k)
		}
	}
	at := s.now().UTC()
	for _, id := range slices.Sorted(maps.Keys(s.deadLetters)) {
		dl := s.deadLetters[id]
		if dl.Consumer != from {
			continue
		}
		k := markKey{consumer: consumer, key: dl.Key()}
		delete(s.byKey, markKey{consumer: from, key: dl.Key()})
		kept, ok := s.byKey[k]
		if !ok {
			dl.Consumer = consumer
			s.byKey[k] = id
			s.appendHistory(id, driver.HistoryEntry{At: at, Kind: driver.HistoryAdopted, By: from})
			continue
		}
		s.merge(id, kept, at, from)
	}
	for _, r := range s.replays {
		if r.Consumer == from && !r.sent {
			r.Consumer = consumer
		}
	}
}

// merge folds the old name's dead letter old into kept, the new name's
// dead letter of the same event. The caller holds s.mu.
func (s *Store) merge(old, kept int64, at time.Time, from string) {
	o, k := s.deadLetters[old], s.deadLetters[kept]
	k.Repeats += o.Repeats + 1
	if o.FirstFailedAt.Before(k.FirstFailedAt) {
		k.FirstFailedAt = o.FirstFailedAt
	}
	s.history[kept] = append(s.history[kept], s.history[old]...)
	slices.SortFunc(s.history[kept], func(a, b historyEntry) int { return cmp.Compare(a.seq, b.seq) })
	delete(s.history, old)
	for _, r := range s.replays {
		if r.DeadLetterID == old {
			r.DeadLetterID = kept
		}
	}
	delete(s.deadLetters, old)
	s.appendHistory(kept, driver.HistoryEntry{
		At: at, Kind: driver.HistoryAdopted, By: from,
		Reason: fmt.Sprintf("merged dead letter %d of %s: this dead letter of the same event is kept", old, from),
	})
}
