package runner

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/memory"
)

// stuckAssigner is a driver.Assigner whose drops never end: each Assign
// after the first waits until its ctx ends, as a subscription does whose
// dropped partitions' messages stay in hand.
type stuckAssigner struct{ calls atomic.Int32 }

func (s *stuckAssigner) Assign(ctx context.Context, _ []int) error {
	if s.calls.Add(1) == 1 {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestPartitionerHeartbeatsWhileAssignWaits: a process whose subscription
// takes long to settle what it must hand back keeps heartbeating, so it
// stays a member of the group and keeps its leases; its assignment is
// asked again at each step until it is done.
func TestPartitionerHeartbeatsWhileAssignWaits(t *testing.T) {
	t.Parallel()
	store, err := memory.NewStore(memory.StoreConfig{})
	require.NoError(t, err)
	const lease = 500 * time.Millisecond
	assigner := &stuckAssigner{}
	p := &partitioner{
		consumer: "c", partitions: 4, member: "a", leases: store, assigner: assigner,
		lease: lease, logger: slog.New(slog.DiscardHandler), held: make(map[int]int64),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	// a takes every partition alone; then b joins, and a must hand two
	// back, which never settles.
	require.Eventually(t, func() bool {
		ls, err := store.PartitionLeases(ctx, "c")
		return err == nil && len(ls) == 4
	}, 10*time.Second, 10*time.Millisecond)
	deadline := time.Now().Add(6 * lease)
	for time.Now().Before(deadline) {
		members, err := store.Heartbeat(ctx, "c", "b", lease)
		require.NoError(t, err)
		require.Equal(t, []string{"a", "b"}, members, "a stopped heartbeating while its assignment waited")
		time.Sleep(lease / 5)
	}
	require.Greater(t, assigner.calls.Load(), int32(2), "the assignment was asked again at later steps")
	ls, err := store.PartitionLeases(ctx, "c")
	require.NoError(t, err)
	for _, l := range ls {
		require.Equal(t, "a", l.Owner, "partition %d: a hands back nothing before its drop is done", l.Partition)
	}
}
