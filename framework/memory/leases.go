package memory

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
)

var _ driver.Leases = (*Store)(nil)

// memberKey keys a member of a consumer's group.
type memberKey struct{ consumer, member string }

// leaseKey keys the lease of a consumer's partition.
type leaseKey struct {
	consumer  string
	partition int
}

// partitionLease is a partition's lease. A lease is never deleted, so
// that a token is never given twice.
type partitionLease struct {
	owner   string // "" when released
	token   int64
	expires time.Time // by the store's clock
	// fences counts the attempts that fenced the lease and have not
	// ended; unfenced is closed when the last one ends. While any is
	// open, the lease does not change owner (see Acquire), as on
	// PostgreSQL, where they hold its row FOR KEY SHARE.
	fences   int
	unfenced chan struct{}
}

// live reports whether l has not expired at now: it ends after its
// expiry, as the SQL stores compare.
func (l *partitionLease) live(now time.Time) bool { return !l.expires.Before(now) }

// errTTL is returned for a ttl that is not positive.
var errTTL = errors.New("ttl must be positive")

// Heartbeat records that member is alive in consumer's group until ttl
// from now, by the store's clock, forgets the members whose time passed,
// and returns the live members, sorted.
func (s *Store) Heartbeat(ctx context.Context, consumer, member string, ttl time.Duration) ([]string, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("heartbeat of %s in %s: %w, got %s", member, consumer, errTTL, ttl)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("heartbeat of %s in %s: %w", member, consumer, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.members[memberKey{consumer, member}] = now.Add(ttl)
	var live []string
	for k, expires := range s.members {
		switch {
		case k.consumer != consumer:
		case expires.Before(now):
			delete(s.members, k)
		default:
			live = append(live, k.member)
		}
	}
	slices.Sort(live)
	return live, nil
}

// Leave removes member from consumer's group and frees its leases: they
// have no owner and are expired, their tokens kept.
func (s *Store) Leave(ctx context.Context, consumer, member string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("leave %s as %s: %w", consumer, member, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.members, memberKey{consumer, member})
	now := s.now()
	for k, l := range s.leases {
		if k.consumer == consumer && l.owner == member {
			l.owner, l.expires = "", now
		}
	}
	return nil
}

// Acquire gives member the lease of partition until ttl from now when
// the lease is free, expired or member's already, and returns its
// token: a new one, greater than every earlier one of the partition,
// unless member renews a lease it holds. ok is false when another
// member holds it. A take of a lease that attempts fenced (see Fence)
// waits until they end, or until ctx ends.
func (s *Store) Acquire(ctx context.Context, consumer string, partition int, member string, ttl time.Duration) (int64, bool, error) {
	if ttl <= 0 {
		return 0, false, fmt.Errorf("acquire partition %d of %s for %s: %w, got %s", partition, consumer, member, errTTL, ttl)
	}
	k := leaseKey{consumer, partition}
	for {
		if err := ctx.Err(); err != nil {
			return 0, false, fmt.Errorf("acquire partition %d of %s for %s: %w", partition, consumer, member, err)
		}
		s.mu.Lock()
		now := s.now()
		l, ok := s.leases[k]
		switch {
		case !ok:
			s.leases[k] = &partitionLease{owner: member, token: 1, expires: now.Add(ttl)}
			s.mu.Unlock()
			return 1, true, nil
		case l.live(now) && l.owner == member:
			l.expires = now.Add(ttl)
			token := l.token
			s.mu.Unlock()
			return token, true, nil
		case l.live(now) && l.owner != "":
			s.mu.Unlock()
			return 0, false, nil
		case l.fences == 0:
			l.owner, l.token, l.expires = member, l.token+1, now.Add(ttl)
			token := l.token
			s.mu.Unlock()
			return token, true, nil
		}
		unfenced := l.unfenced
		s.mu.Unlock()
		select {
		case <-unfenced:
		case <-ctx.Done():
		}
	}
}

// Renew extends member's leases of consumer that have not expired until
// ttl from now, and returns them with their tokens: an expired lease
// must be taken again, with a new token.
func (s *Store) Renew(ctx context.Context, consumer, member string, ttl time.Duration) (map[int]int64, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("renew the leases of %s for %s: %w, got %s", consumer, member, errTTL, ttl)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("renew the leases of %s for %s: %w", consumer, member, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	held := map[int]int64{}
	for k, l := range s.leases {
		if k.consumer == consumer && l.owner == member && l.live(now) {
			l.expires = now.Add(ttl)
			held[k.partition] = l.token
		}
	}
	return held, nil
}

// Release frees partition when member holds it: the lease has no owner
// and is expired, its token kept.
func (s *Store) Release(ctx context.Context, consumer string, partition int, member string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("release partition %d of %s for %s: %w", partition, consumer, member, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.leases[leaseKey{consumer, partition}]; ok && l.owner == member {
		l.owner, l.expires = "", s.now()
	}
	return nil
}

// Fence checks that member holds each partition of fences with its
// token, and returns an error wrapping driver.ErrFenced otherwise. When
// it does, no lease of fences changes owner until tx ends (see Acquire).
func (s *Store) Fence(ctx context.Context, tx *driver.Tx, consumer, member string, fences []driver.Fence) error {
	if len(fences) == 0 {
		return nil
	}
	if tx == nil {
		return fmt.Errorf("fence %d partitions of %s for %s: %w", len(fences), consumer, member, ErrNoTx)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fence %d partitions of %s for %s: %w", len(fences), consumer, member, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	held := map[int]*partitionLease{}
	for _, f := range fences {
		l, ok := s.leases[leaseKey{consumer, f.Partition}]
		var (
			lease *driver.PartitionLease
			live  bool
		)
		if ok {
			lease = &driver.PartitionLease{Consumer: consumer, Partition: f.Partition, Owner: l.owner, Token: l.token}
			live = l.live(now)
		}
		if err := f.Check(consumer, member, lease, live); err != nil {
			return err // a lease that does not exist fails its check
		}
		held[f.Partition] = l
	}
	for _, l := range held {
		if l.fences == 0 {
			l.unfenced = make(chan struct{})
		}
		l.fences++
	}
	var once sync.Once
	end := func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, l := range held {
				if l.fences--; l.fences == 0 {
					close(l.unfenced)
				}
			}
		})
	}
	tx.OnCommit(end)
	tx.OnRollback(end)
	return nil
}

// PartitionLeases lists the leases of consumer, by partition.
func (s *Store) PartitionLeases(ctx context.Context, consumer string) ([]driver.PartitionLease, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list the partition leases of %s: %w", consumer, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var leases []driver.PartitionLease
	for _, k := range slices.SortedFunc(maps.Keys(s.leases), func(a, b leaseKey) int { return a.partition - b.partition }) {
		if k.consumer != consumer {
			continue
		}
		l := s.leases[k]
		leases = append(leases, driver.PartitionLease{Consumer: consumer, Partition: k.partition, Owner: l.owner, Token: l.token, Expires: l.expires})
	}
	return leases, nil
}

// PartitionCount records n as consumer's partition count unless one is,
// and returns the recorded one.
func (s *Store) PartitionCount(ctx context.Context, consumer string, n int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("the partition count of %s: %w", consumer, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if recorded, ok := s.partitions[consumer]; ok {
		return recorded, nil
	}
	s.partitions[consumer] = n
	return n, nil
}

// SetPartitionCount records n as consumer's partition count.
func (s *Store) SetPartitionCount(ctx context.Context, consumer string, n int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("set the partition count of %s to %d: %w", consumer, n, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.partitions[consumer] = n
	return nil
}

// RecordedPartitionCount returns consumer's recorded partition count, 0
// when none is, and records nothing.
func (s *Store) RecordedPartitionCount(ctx context.Context, consumer string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("read the partition count of %s: %w", consumer, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.partitions[consumer], nil
}

// Members returns the live members of consumer's group, sorted, and
// forgets none.
func (s *Store) Members(ctx context.Context, consumer string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("read the live members of %s: %w", consumer, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var live []string
	for k, expires := range s.members {
		if k.consumer == consumer && !expires.Before(now) {
			live = append(live, k.member)
		}
	}
	slices.Sort(live)
	return live, nil
}
