package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/middleware"
)

// TestPartitionLease runs a partitioned consumer with partition_lease
// 2s: the service's leases end 2 s after each renewal, not after the
// default's 15 s, so that a process that dies leaves its partitions to
// the others that soon.
func TestPartitionLease(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	cfg := postgresConfig(t)
	cfg.PartitionLease = app.Duration(lease)
	cfg.Consumers = map[string]middleware.Settings{consumerName: {Partitions: 2}}
	b := setup(t, cfg)
	leases, ok := testStore(t, b.db).(driver.Leases)
	require.True(t, ok, "the PostgreSQL store keeps leases")

	deadline := time.Now().Add(waitLimit)
	for {
		ls, err := leases.PartitionLeases(context.Background(), consumerName)
		require.NoError(t, err)
		owned := 0
		for _, l := range ls {
			// The database's clock and ours are the same machine's.
			if left := time.Until(l.Expires); l.Owner != "" && left > 0 {
				owned++
				require.LessOrEqual(t, left, lease+500*time.Millisecond, "partition %d's lease ends in %s: not partition_lease's %s", l.Partition, left, lease)
			}
		}
		if owned == 2 {
			return
		}
		require.True(t, time.Now().Before(deadline), "the service did not take both partitions within %s: %+v", waitLimit, ls)
		time.Sleep(50 * time.Millisecond)
	}
}
