package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// DefaultDeadLetterLimit is how many dead letters DeadLetters returns when
// the filter sets no limit.
const DefaultDeadLetterLimit = 100

// ErrNoTx is returned by Mark, Forget, Checkpoint and Advance without the
// attempt's transaction.
var ErrNoTx = errors.New("memory: no transaction (call through driver.UnitOfWork)")

// Store keeps processed marks, delivery counts, subject checkpoints,
// dead letters and partition leases in the memory of one process. It
// implements driver.Store and driver.Leases for tests and for the memory
// transport: nothing survives a restart, and two processes with a store
// each do not see each other's marks.
//
// It behaves like the SQL stores inside one process: a mark or a
// forgotten count takes effect when the unit of work commits and is
// undone when it rolls back, and Mark of a key whose mark another attempt
// holds waits until that attempt ends. Use it with a UnitOfWork whose DB
// is nil.
type Store struct {
	now func() time.Time

	mu          sync.Mutex
	marks       map[markKey]*mark
	deliveries  map[markKey]int
	deadLetters map[int64]*driver.DeadLetter
	byKey       map[markKey]int64
	lastID      int64
	checkpoints map[subjectKey]*checkpoint
	waits       map[waitKey]wait
	parked      map[waitKey]driver.ParkedEvent // held and parked events
	skipped     map[waitKey]framework.Key      // discarded holds whose turn has not come, by the discarded event (see Skip)
	history     map[int64][]historyEntry       // by dead letter
	historySeq  int64
	replays     map[int64]*storedReplay
	lastReplay  int64
	// purgedBefore is how far PurgeProcessed deleted (see InspectEvent).
	purgedBefore time.Time
	members      map[memberKey]time.Time // expiry of each member of a consumer's group
	leases       map[leaseKey]*partitionLease
	partitions   map[string]int // the partition count of each consumer
}

var _ driver.Store = (*Store)(nil)

// markKey keys a consumer's record of one event.
type markKey struct {
	consumer string
	key      framework.Key
}

// mark is a processed mark, held by the attempt tx until it commits.
type mark struct {
	tx        *driver.Tx
	committed bool
	at        time.Time     // when it was made, by the store's clock
	done      chan struct{} // closed when tx ends
}

// StoreConfig configures a Store.
type StoreConfig struct {
	// Now is the store's clock: it stamps the processed marks (see
	// PurgeProcessed), the dead letters and the waits behind a gap (see
	// WaitGap). Defaults to time.Now.
	Now func() time.Time
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c StoreConfig) WithDefaults() StoreConfig {
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first invalid field of c.
func (c StoreConfig) Validate() error {
	if c.Now == nil {
		return errors.New("memory: StoreConfig.Now is nil (leave it unset and call WithDefaults for time.Now)")
	}
	return nil
}

// NewStore returns an empty Store configured by cfg.
func NewStore(cfg StoreConfig) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{
		now:         cfg.Now,
		marks:       make(map[markKey]*mark),
		deliveries:  make(map[markKey]int),
		deadLetters: make(map[int64]*driver.DeadLetter),
		byKey:       make(map[markKey]int64),
		checkpoints: make(map[subjectKey]*checkpoint),
		waits:       make(map[waitKey]wait),
		parked:      make(map[waitKey]driver.ParkedEvent),
		skipped:     make(map[waitKey]framework.Key),
		history:     make(map[int64][]historyEntry),
		replays:     make(map[int64]*storedReplay),
		members:     make(map[memberKey]time.Time),
		leases:      make(map[leaseKey]*partitionLease),
		partitions:  make(map[string]int),
	}, nil
}

// Mark records that consumer processed key when tx commits. It returns
// false when the mark exists, and when consumer's dead letter of key is
// discarded (see driver.Store.Mark). While another attempt holds the mark
// uncommitted, Mark waits: for a duplicate when that attempt commits, for
// the mark when it rolls back, or until ctx ends.
func (s *Store) Mark(ctx context.Context, tx *driver.Tx, consumer string, key framework.Key) (bool, error) {
	if tx == nil {
		return false, fmt.Errorf("mark %s for %s: %w", key, consumer, ErrNoTx)
	}
	k := markKey{consumer: consumer, key: key}
	for {
		s.mu.Lock()
		m, ok := s.marks[k]
		switch {
		case !ok && s.discarded(k):
			s.mu.Unlock()
			return false, nil
		case !ok:
			m = &mark{tx: tx, at: s.now(), done: make(chan struct{})}
			s.marks[k] = m
			s.mu.Unlock()
			tx.OnCommit(func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				m.committed = true
				close(m.done)
			})
			tx.OnRollback(func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				delete(s.marks, k)
				close(m.done)
			})
			return true, nil
		case m.committed || m.tx == tx:
			s.mu.Unlock()
			return false, nil
		}
		done := m.done
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return false, fmt.Errorf("mark %s for %s: %w", key, consumer, ctx.Err())
		}
	}
}

// discarded reports whether the dead letter of k is discarded. s.mu is
// held.
func (s *Store) discarded(k markKey) bool {
	id, ok := s.byKey[k]
	return ok && s.deadLetters[id].Status == driver.DeadLetterDiscarded
}

// Count records one more delivery of key to consumer and returns the
// count; a new count starts at first. A first of 0 counts nothing: a new
// count starts at zero, a count stays as it is (see driver.Store.Count).
func (s *Store) Count(ctx context.Context, consumer string, key framework.Key, first int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("count delivery of %s to %s: %w", key, consumer, err)
	}
	k := markKey{consumer: consumer, key: key}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.deliveries[k]
	switch {
	case !ok:
		n = max(first, 0)
	case first > 0:
		n++
	}
	s.deliveries[k] = n
	return n, nil
}

// Uncount takes back one delivery of key to consumer, never below zero;
// a key without a count gets one at zero.
func (s *Store) Uncount(ctx context.Context, consumer string, key framework.Key) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("uncount delivery of %s to %s: %w", key, consumer, err)
	}
	k := markKey{consumer: consumer, key: key}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deliveries[k] = max(s.deliveries[k]-1, 0)
	return nil
}

// Forget removes the delivery count of key when tx commits.
func (s *Store) Forget(ctx context.Context, tx *driver.Tx, consumer string, key framework.Key) error {
	if tx == nil {
		return fmt.Errorf("forget delivery count of %s for %s: %w", key, consumer, ErrNoTx)
	}
	k := markKey{consumer: consumer, key: key}
	tx.OnCommit(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.deliveries, k)
	})
	return nil
}

// PublishDeadLetter stores dl, or updates the dead letter of the same
// consumer and key: a repeat counts in Repeats, takes the latest code,
// subject sequence, attempts, delivery count, message and LastFailedAt,
// keeps FirstFailedAt and is pending again, even when it had been
// replayed or discarded: its Resolution is zero while pending, and the
// earlier resolutions stay in its history, to which every failure appends
// a failed entry. The store stamps
// the times with its clock. It also forgets the message's delivery count
// for the consumer (see Count), in the same transaction, so that a replay
// is counted afresh instead of hitting the delivery limit at once, and
// ends the event's wait or parking under its key at its subject and
// sequence.
func (s *Store) PublishDeadLetter(ctx context.Context, dl driver.DeadLetter) error {
	return s.storeDeadLetter(ctx, dl, false)
}

// HoldDeadLetter stores dl as PublishDeadLetter does and, at once, holds
// its subject: the later events of the subject wait behind it, unless
// its checkpoint is at or past dl.SubjectSeq.
func (s *Store) HoldDeadLetter(ctx context.Context, dl driver.DeadLetter) error {
	return s.storeDeadLetter(ctx, dl, dl.Subject != "" && dl.SubjectSeq != 0)
}

func (s *Store) storeDeadLetter(ctx context.Context, dl driver.DeadLetter, hold bool) error {
	if err := dl.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish dead letter %s for %s: %w", dl.Key(), dl.Consumer, err)
	}
	at := s.now().UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case hold:
		s.holdSubject(dl.Consumer, dl.Subject, dl.SubjectSeq, dl.Key())
	case dl.Subject != "" && dl.SubjectSeq != 0:
		s.endOwnWait(dl.Consumer, dl.Subject, dl.SubjectSeq, dl.Key())
	}
	s.putDeadLetter(dl, at)
	return nil
}

// putDeadLetter stores dl, failed at at, or counts its repeat, with the
// failure in its history, and forgets its delivery count. s.mu is held.
func (s *Store) putDeadLetter(dl driver.DeadLetter, at time.Time) {
	dl.Body = slices.Clone(dl.Body)
	dl.Metadata = driver.StorableMetadata(dl.Metadata)
	dl.Status = driver.DeadLetterPending
	dl.Resolution = driver.Resolution{}
	dl.LastFailedAt = at
	k := markKey{consumer: dl.Consumer, key: dl.Key()}
	delete(s.deliveries, k)
	if id, ok := s.byKey[k]; ok && !bytes.Equal(s.deadLetters[id].Body, dl.Body) {
		// Another body under the key: kept under its own digest (see
		// driver.Store.PublishDeadLetter).
		k.key = framework.DigestKey(dl.Body)
		dl.Source, dl.EventID = k.key.Source, k.key.ID
	}
	if id, ok := s.byKey[k]; ok {
		old := s.deadLetters[id]
		dl.ID, dl.FirstFailedAt, dl.Repeats = id, old.FirstFailedAt, old.Repeats+1
	} else {
		s.lastID++
		dl.ID, dl.FirstFailedAt, dl.Repeats = s.lastID, at, 0
		s.byKey[k] = dl.ID
	}
	s.deadLetters[dl.ID] = &dl
	s.appendHistory(dl.ID, driver.HistoryEntry{
		At: at, Kind: driver.HistoryFailed, Code: dl.Code, Attempts: dl.Attempts, Deliveries: dl.Deliveries,
	})
}

// DeadLetter returns the dead letter with id, or an error wrapping
// driver.ErrNotFound.
func (s *Store) DeadLetter(ctx context.Context, id int64) (driver.DeadLetter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dl, ok := s.deadLetters[id]
	if !ok {
		return driver.DeadLetter{}, fmt.Errorf("get dead letter %d: %w", id, driver.ErrNotFound)
	}
	return clone(dl), nil
}

// DeadLetters lists the dead letters that match f, by ascending ID.
func (s *Store) DeadLetters(ctx context.Context, f driver.DeadLetterFilter) ([]driver.DeadLetter, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("list dead letters: negative limit %d", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = DefaultDeadLetterLimit
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := slices.Sorted(maps.Keys(s.deadLetters))
	var out []driver.DeadLetter
	for _, id := range ids {
		dl := s.deadLetters[id]
		if id <= f.AfterID || !matches(dl, f) {
			continue
		}
		c := clone(dl)
		if f.WithoutBody {
			c.Body = nil
		}
		out = append(out, c)
		if len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// ResolveDeadLetter moves the pending dead letter id to r.Status
// (replayed or discarded) with who, why and when (zero r.At means now),
// appends r to its history and, for a replay, records its message as a
// Replay to its consumer (see driver.DeadLetter.ReplayMessage), all at
// once. It returns the dead letter as it was, an error wrapping
// driver.ErrNotFound when there is no dead letter id, or one wrapping
// driver.ErrNotPending and naming the status when it is not pending.
func (s *Store) ResolveDeadLetter(ctx context.Context, id int64, r driver.Resolution) (driver.DeadLetter, error) {
	if err := r.Validate(); err != nil {
		return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: %w", id, err)
	}
	now := s.now().UTC()
	if r.At.IsZero() {
		r.At = now
	}
	r.At = r.At.UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	dl, ok := s.deadLetters[id]
	switch {
	case !ok:
		return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: %w", id, driver.ErrNotFound)
	case dl.Status != driver.DeadLetterPending:
		return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: %w: %s", id, driver.ErrNotPending, dl.Status)
	}
	before := clone(dl)
	dl.Status = r.Status
	dl.Resolution = r
	s.appendHistory(id, driver.HistoryEntry{At: r.At, Kind: driver.HistoryKind(r.Status), By: r.By, Reason: r.Reason})
	if r.Status == driver.DeadLetterReplayed {
		msg := before.ReplayMessage()
		s.addReplay(driver.Replay{
			DeadLetterID: id, Consumer: dl.Consumer, Topic: dl.Topic, Body: msg.Payload, Metadata: msg.Metadata,
		}, now)
	}
	return before, nil
}

func clone(dl *driver.DeadLetter) driver.DeadLetter {
	c := *dl
	c.Body = slices.Clone(dl.Body)
	c.Metadata = maps.Clone(dl.Metadata)
	return c
}

// matches reports whether dl matches the fields of f that are set, but
// AfterID and Limit.
func matches(dl *driver.DeadLetter, f driver.DeadLetterFilter) bool {
	for _, c := range []struct{ want, got string }{
		{f.Consumer, dl.Consumer},
		{string(f.Code), string(dl.Code)},
		{string(f.Status), string(dl.Status)},
		{f.Type, dl.Type},
		{f.Subject, dl.Subject},
		{f.Source, dl.Source},
		{f.EventID, dl.EventID},
	} {
		if c.want != "" && c.want != c.got {
			return false
		}
	}
	return (f.FailedSince.IsZero() || !dl.FirstFailedAt.Before(f.FailedSince)) &&
		(f.FailedBefore.IsZero() || dl.FirstFailedAt.Before(f.FailedBefore))
}
