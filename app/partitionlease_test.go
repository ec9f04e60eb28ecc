package app_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/middleware"
)

// TestPartitionLease runs a partitioned consumer with partition_lease
// 2s: the service's leases end 2 s after each renewal, not after the
// default's 15 s, so that a process that dies leaves its partitions to
// the others that soon. The service's connections to PostgreSQL, the
// stores' and the transport's, are named after its member, the owner of
// its leases, so that a process that takes its partitions over, once it
// froze past its lease, can end them (driver.SessionEnder).
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
			requireNamedSessions(t, b.db, ls[0].Owner)
			return
		}
		require.True(t, time.Now().Before(deadline), "the service did not take both partitions within %s: %+v", waitLimit, ls)
		time.Sleep(50 * time.Millisecond)
	}
}

// requireNamedSessions waits until sessions named after member
// (application_name) have run, on the stores' pool, a statement of the
// leases and, on the PostgreSQL transport's, one of its tables.
func requireNamedSessions(t *testing.T, db *sqlx.DB, member string) {
	t.Helper()
	var queries []string
	require.Eventually(t, func() bool {
		queries = nil
		err := db.SelectContext(context.Background(), &queries,
			`SELECT query FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, member)
		return err == nil && slices.ContainsFunc(queries, func(q string) bool { return strings.Contains(q, "partition_leases") }) &&
			slices.ContainsFunc(queries, func(q string) bool { return strings.Contains(q, "watermill_") })
	}, waitLimit, 50*time.Millisecond, "sessions named %s: their last statements %q", member, queries)
}
