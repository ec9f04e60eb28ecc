package postgres_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/outage"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestEndStaleOwner: a member frozen past its lease keeps its sessions,
// an open transaction that locked its lease's row (as a batch's fence
// does) and a session's advisory lock (as a PostgreSQL subscription
// does). The member that takes the partition over ends them
// (driver.SessionEnder): its take does not wait, the lock is free, and
// the stale transaction can no longer commit. A member whose lease
// expired while its heartbeat did not, one whose sessions are not quiet
// (it runs late), and the owner itself, are left alone.
func TestEndStaleOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	db, err := postgres.Open(ctx, url, postgres.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	store, err := postgres.NewStore(db, postgres.StoreConfig{})
	require.NoError(t, err)
	var _ driver.SessionEnder = store

	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	consumer := "billing.stale-" + suffix
	stale, live := "stale-"+suffix, "live-"+suffix
	staleDB, err := postgres.Open(ctx, url, postgres.OpenConfig{ApplicationName: stale})
	require.NoError(t, err)
	t.Cleanup(func() { _ = staleDB.Close() })
	staleStore, err := postgres.NewStore(staleDB, postgres.StoreConfig{})
	require.NoError(t, err)

	const (
		ttl   = time.Second
		quiet = 500 * time.Millisecond
	)
	_, err = staleStore.Heartbeat(ctx, consumer, stale, ttl)
	require.NoError(t, err)
	_, ok, err := staleStore.Acquire(ctx, consumer, 0, stale, ttl)
	require.NoError(t, err)
	require.True(t, ok)
	// live's lease expires, its membership does not.
	_, err = store.Heartbeat(ctx, consumer, live, time.Minute)
	require.NoError(t, err)
	_, ok, err = store.Acquire(ctx, consumer, 1, live, ttl)
	require.NoError(t, err)
	require.True(t, ok)

	// The stale member's transaction locks its lease's row, and a
	// session of it holds an advisory lock.
	tx, err := staleDB.BeginTxx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	_, err = tx.ExecContext(ctx, `SELECT 1 FROM partition_leases WHERE consumer = $1 AND partition = 0 FOR KEY SHARE`, consumer)
	require.NoError(t, err)
	key := time.Now().UnixNano()
	conn, err := staleDB.Connx(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key)
	require.NoError(t, err)

	owner, ended, err := store.EndStaleOwner(ctx, consumer, 0, "b", quiet)
	require.NoError(t, err)
	require.Empty(t, owner, "a live lease's owner is not stale")
	require.Zero(t, ended)

	time.Sleep(ttl + 200*time.Millisecond)
	owner, ended, err = store.EndStaleOwner(ctx, consumer, 0, stale, quiet)
	require.NoError(t, err)
	require.Empty(t, owner, "the owner asking is not stale")
	require.Zero(t, ended)
	owner, ended, err = store.EndStaleOwner(ctx, consumer, 1, "b", quiet)
	require.NoError(t, err)
	require.Empty(t, owner, "an owner whose heartbeat is live is not stale, though its lease expired")
	require.Zero(t, ended)

	// A statement of the stale member: it runs late, and is left alone
	// until it has been quiet for quiet.
	_, err = staleDB.ExecContext(ctx, `SELECT 1`)
	require.NoError(t, err)
	owner, ended, err = store.EndStaleOwner(ctx, consumer, 0, "b", quiet)
	require.NoError(t, err)
	require.Equal(t, stale, owner)
	require.Zero(t, ended, "a stale owner that runs late keeps its sessions")
	time.Sleep(quiet + 200*time.Millisecond)

	owner, ended, err = store.EndStaleOwner(ctx, consumer, 0, "b", quiet)
	require.NoError(t, err)
	require.Equal(t, stale, owner)
	require.GreaterOrEqual(t, ended, 2, "the stale member's transaction and its advisory lock's session")
	var left int
	require.NoError(t, db.GetContext(ctx, &left, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, stale))
	require.Zero(t, left, "the stale member's sessions exited before EndStaleOwner returned")

	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, ok, err = store.Acquire(wait, consumer, 0, "b", time.Minute)
	require.NoError(t, err, "the take does not wait for the stale transaction")
	require.True(t, ok)
	require.Eventually(t, func() bool {
		var locked bool
		return db.GetContext(ctx, &locked, `SELECT pg_try_advisory_lock($1)`, key) == nil && locked
	}, 5*time.Second, 50*time.Millisecond, "the stale session's advisory lock is free")
	_, err = db.ExecContext(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)

	err = tx.Commit()
	require.Error(t, err, "the stale transaction cannot commit")
	require.True(t, outage.Is(err), "a connection the server ended: %v", err)
	var n int
	require.NoError(t, staleDB.GetContext(ctx, &n, `SELECT 1`), "the stale member's pool connects again")
}
