package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
)

// The partition leases (driver.Leases) run on the database's clock, or
// the memory store's, not on the suite's fake one: their cases open a
// store on time.Now and wait for real. A lease that must be live has a
// long ttl; one that must expire has shortTTL and is waited past with
// expiryWait, generous for -race on few cores.
const (
	leaseConsumer = "billing.charge-on-order-placed"
	longTTL       = time.Minute
	shortTTL      = 300 * time.Millisecond
	expiryWait    = 800 * time.Millisecond
)

// setupLeases returns a bundle on a store whose clock is time.Now, and
// its leases; it fails the test when the store keeps none.
func setupLeases(t *testing.T, newHarness func(t *testing.T) Harness) (*bundle, driver.Leases) {
	t.Helper()
	h := newHarness(t)
	b := &bundle{h: h, clock: newClock(), effects: newEffects(t, h.DB)}
	b.store = h.NewStore(t, Config{Now: time.Now})
	leases, ok := b.store.(driver.Leases)
	require.True(t, ok, "%T keeps no partition leases (driver.Leases): every store of the framework does", b.store)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: h.DB, Store: b.store})
	require.NoError(t, err)
	b.uow = uow
	return b, leases
}

// acquire takes partition for member and requires the outcome ok.
func acquire(t *testing.T, l driver.Leases, partition int, member string, ttl time.Duration, ok bool) int64 {
	t.Helper()
	token, got, err := l.Acquire(context.Background(), leaseConsumer, partition, member, ttl)
	require.NoError(t, err)
	require.Equal(t, ok, got, "acquire partition %d for %s", partition, member)
	if ok {
		require.Positive(t, token)
	}
	return token
}

// fence runs Fence in an attempt of its own, which commits, and returns
// Fence's error.
func (b *bundle) fence(t *testing.T, l driver.Leases, member string, fences ...driver.Fence) error {
	t.Helper()
	var fenced error
	require.NoError(t, b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
		fenced = l.Fence(ctx, tx, leaseConsumer, member, fences)
		return nil
	}))
	return fenced
}

// leaseOf returns the lease of partition as PartitionLeases lists it.
func leaseOf(t *testing.T, l driver.Leases, partition int) driver.PartitionLease {
	t.Helper()
	all, err := l.PartitionLeases(context.Background(), leaseConsumer)
	require.NoError(t, err)
	for _, pl := range all {
		if pl.Partition == partition {
			return pl
		}
	}
	require.Failf(t, "no lease", "partition %d has no lease in %v", partition, all)
	return driver.PartitionLease{}
}

func exerciseLeases(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Run("ExclusiveOwnership", func(t *testing.T) {
		t.Parallel()
		_, l := setupLeases(t, newHarness)
		ctx := context.Background()
		const partitions, racers = 3, 8
		for p := range partitions {
			var (
				mu   sync.Mutex
				wins = map[string][]int64{}
				wg   sync.WaitGroup
				errs = make(chan error, 2*racers)
			)
			for i := range 2 * racers {
				member := []string{"a", "b"}[i%2]
				wg.Go(func() {
					token, ok, err := l.Acquire(ctx, leaseConsumer, p, member, longTTL)
					if err != nil {
						errs <- err
						return
					}
					if ok {
						mu.Lock()
						wins[member] = append(wins[member], token)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Len(t, wins, 1, "partition %d: one member wins, the other never: %v", p, wins)
			for winner, tokens := range wins {
				for _, token := range tokens {
					require.Equal(t, tokens[0], token, "the winner renews its lease, with the same token")
				}
				pl := leaseOf(t, l, p)
				require.Equal(t, winner, pl.Owner)
				require.Equal(t, tokens[0], pl.Token)
				require.Equal(t, leaseConsumer, pl.Consumer)
			}
		}
		all, err := l.PartitionLeases(ctx, leaseConsumer)
		require.NoError(t, err)
		require.Len(t, all, partitions)
		for i, pl := range all {
			require.Equal(t, i, pl.Partition, "by partition")
		}
		other, err := l.PartitionLeases(ctx, "another.consumer")
		require.NoError(t, err)
		require.Empty(t, other, "leases are a consumer's own")
	})

	t.Run("PartitionCount", func(t *testing.T) {
		t.Parallel()
		_, leases := setupLeases(t, newHarness)
		ctx := context.Background()
		n, err := leases.PartitionCount(ctx, leaseConsumer, 8)
		require.NoError(t, err)
		require.Equal(t, 8, n, "the first count is recorded")
		n, err = leases.PartitionCount(ctx, leaseConsumer, 16)
		require.NoError(t, err)
		require.Equal(t, 8, n, "a later count does not replace it")
		n, err = leases.PartitionCount(ctx, "another", 2)
		require.NoError(t, err)
		require.Equal(t, 2, n, "per consumer")
		require.NoError(t, leases.SetPartitionCount(ctx, leaseConsumer, 16))
		n, err = leases.PartitionCount(ctx, leaseConsumer, 4)
		require.NoError(t, err)
		require.Equal(t, 16, n, "the operator's count replaces it")
	})
	t.Run("ReadsChangeNothing", func(t *testing.T) {
		t.Parallel()
		_, l := setupLeases(t, newHarness)
		ctx := context.Background()
		n, err := l.RecordedPartitionCount(ctx, leaseConsumer)
		require.NoError(t, err)
		require.Zero(t, n, "none recorded")
		n, err = l.PartitionCount(ctx, leaseConsumer, 4)
		require.NoError(t, err)
		require.Equal(t, 4, n, "RecordedPartitionCount recorded nothing")
		n, err = l.RecordedPartitionCount(ctx, leaseConsumer)
		require.NoError(t, err)
		require.Equal(t, 4, n)
		n, err = l.RecordedPartitionCount(ctx, "another.consumer")
		require.NoError(t, err)
		require.Zero(t, n, "per consumer")

		members, err := l.Members(ctx, leaseConsumer)
		require.NoError(t, err)
		require.Empty(t, members)
		_, err = l.Heartbeat(ctx, leaseConsumer, "b", longTTL)
		require.NoError(t, err)
		_, err = l.Heartbeat(ctx, leaseConsumer, "a", longTTL)
		require.NoError(t, err)
		_, err = l.Heartbeat(ctx, leaseConsumer, "short", shortTTL)
		require.NoError(t, err)
		_, err = l.Heartbeat(ctx, "another.consumer", "c", longTTL)
		require.NoError(t, err)
		members, err = l.Members(ctx, leaseConsumer)
		require.NoError(t, err)
		require.Equal(t, []string{"a", "b", "short"}, members, "the live members, sorted, of the consumer alone")
		time.Sleep(expiryWait)
		members, err = l.Members(ctx, leaseConsumer)
		require.NoError(t, err)
		require.Equal(t, []string{"a", "b"}, members, "not an expired member")
		require.NoError(t, l.Leave(ctx, leaseConsumer, "b"))
		members, err = l.Members(ctx, leaseConsumer)
		require.NoError(t, err)
		require.Equal(t, []string{"a"}, members, "not one that left")
	})
	t.Run("ExpiryLetsAnotherTake", func(t *testing.T) {
		t.Parallel()
		_, l := setupLeases(t, newHarness)
		first := acquire(t, l, 0, "a", longTTL, true)
		require.Equal(t, first, acquire(t, l, 0, "a", longTTL, true), "a renewal keeps the token")
		acquire(t, l, 0, "b", longTTL, false)
		_, ok, err := l.Acquire(context.Background(), "another.consumer", 0, "b", longTTL)
		require.NoError(t, err)
		require.True(t, ok, "another consumer's partition 0 is another lease")

		// a's renewal with a short ttl shortens its lease.
		require.Equal(t, first, acquire(t, l, 0, "a", shortTTL, true))
		time.Sleep(expiryWait)
		taken := acquire(t, l, 0, "b", longTTL, true)
		require.Greater(t, taken, first, "a new owner, a greater token")
		acquire(t, l, 0, "a", longTTL, false)
		pl := leaseOf(t, l, 0)
		require.Equal(t, "b", pl.Owner)
		require.Equal(t, taken, pl.Token)
		require.True(t, pl.Expires.After(time.Now().Add(longTTL/2)), "expires %s, a minute from now", pl.Expires)

		// The owner that takes its own lease again once it expired gets a
		// new token too: attempts fenced with the old one fail.
		require.Equal(t, taken, acquire(t, l, 0, "b", shortTTL, true))
		time.Sleep(expiryWait)
		again := acquire(t, l, 0, "b", longTTL, true)
		require.Greater(t, again, taken)
	})

	t.Run("Renew", func(t *testing.T) {
		t.Parallel()
		_, l := setupLeases(t, newHarness)
		ctx := context.Background()
		kept := acquire(t, l, 0, "a", longTTL, true)
		acquire(t, l, 1, "a", shortTTL, true)
		acquire(t, l, 2, "a", shortTTL, true)
		time.Sleep(expiryWait)
		stolen := acquire(t, l, 2, "b", longTTL, true)

		held, err := l.Renew(ctx, leaseConsumer, "a", longTTL)
		require.NoError(t, err)
		require.Equal(t, map[int]int64{0: kept}, held, "partition 1 expired, partition 2 is b's")
		held, err = l.Renew(ctx, leaseConsumer, "b", longTTL)
		require.NoError(t, err)
		require.Equal(t, map[int]int64{2: stolen}, held)
		held, err = l.Renew(ctx, leaseConsumer, "c", longTTL)
		require.NoError(t, err)
		require.Empty(t, held)

		// A renewal with a short ttl lets the lease expire: renewing it
		// again then finds nothing, and another member takes it.
		held, err = l.Renew(ctx, leaseConsumer, "a", shortTTL)
		require.NoError(t, err)
		require.Equal(t, map[int]int64{0: kept}, held)
		time.Sleep(expiryWait)
		held, err = l.Renew(ctx, leaseConsumer, "a", longTTL)
		require.NoError(t, err)
		require.Empty(t, held)
		require.Greater(t, acquire(t, l, 0, "b", longTTL, true), kept)
	})

	t.Run("ReleaseAndLeave", func(t *testing.T) {
		t.Parallel()
		_, l := setupLeases(t, newHarness)
		ctx := context.Background()
		t0 := acquire(t, l, 0, "a", longTTL, true)
		t1 := acquire(t, l, 1, "a", longTTL, true)

		require.NoError(t, l.Release(ctx, leaseConsumer, 0, "b"), "a release by another is a no-op")
		acquire(t, l, 0, "b", longTTL, false)
		require.NoError(t, l.Release(ctx, leaseConsumer, 0, "a"))
		require.Empty(t, leaseOf(t, l, 0).Owner, "released")
		require.Equal(t, t0, leaseOf(t, l, 0).Token, "the token stays until another takes it")
		taken := acquire(t, l, 0, "b", longTTL, true)
		require.Greater(t, taken, t0)
		require.NoError(t, l.Release(ctx, leaseConsumer, 0, "b"))
		require.Greater(t, acquire(t, l, 0, "a", longTTL, true), taken, "a released lease taken by its last owner gets a new token")

		_, err := l.Heartbeat(ctx, leaseConsumer, "a", longTTL)
		require.NoError(t, err)
		require.NoError(t, l.Leave(ctx, leaseConsumer, "a"))
		require.Empty(t, leaseOf(t, l, 1).Owner)
		held, err := l.Renew(ctx, leaseConsumer, "a", longTTL)
		require.NoError(t, err)
		require.Empty(t, held, "a left: its leases are free")
		require.Greater(t, acquire(t, l, 1, "b", longTTL, true), t1)
		members, err := l.Heartbeat(ctx, leaseConsumer, "b", longTTL)
		require.NoError(t, err)
		require.Equal(t, []string{"b"}, members, "a left the group")
		require.NoError(t, l.Leave(ctx, leaseConsumer, "nobody"), "leaving a group one is not in is a no-op")
	})

	t.Run("Heartbeat", func(t *testing.T) {
		t.Parallel()
		_, l := setupLeases(t, newHarness)
		ctx := context.Background()
		beat := func(member string, ttl time.Duration) []string {
			t.Helper()
			members, err := l.Heartbeat(ctx, leaseConsumer, member, ttl)
			require.NoError(t, err)
			return members
		}
		require.Equal(t, []string{"m-b"}, beat("m-b", longTTL))
		require.Equal(t, []string{"m-a", "m-b"}, beat("m-a", longTTL), "sorted")
		require.Equal(t, []string{"m-a", "m-b", "m-c"}, beat("m-c", longTTL))
		members, err := l.Heartbeat(ctx, "another.consumer", "x", longTTL)
		require.NoError(t, err)
		require.Equal(t, []string{"x"}, members, "a group is a consumer's own")

		beat("m-a", shortTTL) // shortens m-a's membership
		time.Sleep(expiryWait)
		require.Equal(t, []string{"m-b", "m-c"}, beat("m-b", longTTL), "m-a's time passed")
		require.Equal(t, []string{"m-a", "m-b", "m-c"}, beat("m-a", longTTL), "a member that beats again is back")
		require.NoError(t, l.Leave(ctx, leaseConsumer, "m-c"))
		require.Equal(t, []string{"m-a", "m-b"}, beat("m-a", longTTL))

		_, err = l.Heartbeat(ctx, leaseConsumer, "m-a", 0)
		require.Error(t, err, "a ttl must be positive")
	})

	t.Run("Fence", func(t *testing.T) {
		t.Parallel()
		b, l := setupLeases(t, newHarness)
		ctx := context.Background()
		t0 := acquire(t, l, 0, "a", longTTL, true)
		t1 := acquire(t, l, 1, "a", longTTL, true)
		acquire(t, l, 2, "b", longTTL, true)

		require.NoError(t, l.Fence(ctx, nil, leaseConsumer, "a", nil), "no fences, nothing to check")
		require.NoError(t, b.fence(t, l, "a"))
		require.NoError(t, b.fence(t, l, "a", driver.Fence{Partition: 0, Token: t0}, driver.Fence{Partition: 1, Token: t1}))
		require.NoError(t, b.fence(t, l, "a", driver.Fence{Partition: 1, Token: t1}, driver.Fence{Partition: 1, Token: t1}), "a partition twice")

		for _, tt := range []struct {
			name   string
			member string
			fences []driver.Fence
			bad    string
		}{
			{"WrongToken", "a", []driver.Fence{{Partition: 0, Token: t0}, {Partition: 1, Token: t1 + 1}}, "partition 1"},
			{"OtherOwner", "b", []driver.Fence{{Partition: 0, Token: t0}}, "partition 0"},
			{"OthersPartition", "a", []driver.Fence{{Partition: 0, Token: t0}, {Partition: 2, Token: 1}}, "partition 2"},
			{"NeverHeld", "a", []driver.Fence{{Partition: 9, Token: 1}}, "partition 9"},
		} {
			err := b.fence(t, l, tt.member, tt.fences...)
			require.ErrorIs(t, err, driver.ErrFenced, tt.name)
			require.ErrorContains(t, err, tt.bad, tt.name)
		}

		require.Equal(t, t1, acquire(t, l, 1, "a", shortTTL, true))
		time.Sleep(expiryWait)
		err := b.fence(t, l, "a", driver.Fence{Partition: 0, Token: t0}, driver.Fence{Partition: 1, Token: t1})
		require.ErrorIs(t, err, driver.ErrFenced, "an expired lease fences, though no one took it")
		require.ErrorContains(t, err, "partition 1")

		require.NoError(t, l.Release(ctx, leaseConsumer, 0, "a"))
		err = b.fence(t, l, "a", driver.Fence{Partition: 0, Token: t0})
		require.ErrorIs(t, err, driver.ErrFenced, "a released lease fences")
	})

	t.Run("FenceHoldsTheLease", func(t *testing.T) {
		t.Parallel()
		b, l := setupLeases(t, newHarness)
		exerciseFenceHolds(t, b, l)
	})
}

// exerciseFenceHolds: while an attempt that fenced a partition has not
// ended, another member's take of its lease, expired meanwhile, waits;
// once the attempt commits, the take goes through with a greater token.
// Every store holds it so: PostgreSQL locks the leases FOR KEY SHARE, SQLite
// holds the file's write lock, the memory store counts the attempts.
func exerciseFenceHolds(t *testing.T, b *bundle, l driver.Leases) {
	const ttl = 2 * time.Second
	acquired := time.Now()
	token := acquire(t, l, 0, "a", ttl, true)

	fenced, release, committed := make(chan error, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		committed <- b.inTx(context.Background(), func(ctx context.Context, tx *driver.Tx) error {
			fenced <- l.Fence(ctx, tx, leaseConsumer, "a", []driver.Fence{{Partition: 0, Token: token}})
			<-release
			return nil
		})
	}()
	if err := <-fenced; err != nil {
		close(release)
		require.NoError(t, <-committed)
		t.Fatalf("a's fence of its lease of %s: %v", ttl, err)
	}
	time.Sleep(time.Until(acquired.Add(ttl + expiryWait)))

	type took struct {
		token int64
		ok    bool
		err   error
	}
	taken := make(chan took, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		token, ok, err := l.Acquire(ctx, leaseConsumer, 0, "b", time.Minute)
		taken <- took{token, ok, err}
	}()
	select {
	case got := <-taken:
		close(release)
		t.Fatalf("b took the lease while a's attempt that fenced it was open: %+v", got)
	case <-time.After(shortTTL):
	}
	close(release)
	require.NoError(t, <-committed)
	select {
	case got := <-taken:
		require.NoError(t, got.err)
		require.True(t, got.ok, "the lease expired")
		require.Greater(t, got.token, token)
	case <-time.After(30 * time.Second):
		t.Fatal("b's take still waits after a's attempt ended")
	}
}
