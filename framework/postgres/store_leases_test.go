package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestFenceLetsTheOwnerRenew: the leases that an open attempt fenced
// (FOR KEY SHARE) hold off a change of owner only (the storetest suite's
// FenceHoldsTheLease): their owner renews and releases them, and another
// member's take of a lease still held is refused, without waiting for
// the attempt. A renewal that waited could deadlock with a batch that
// fences another of its leases after it.
func TestFenceLetsTheOwnerRenew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	store, err := postgres.NewStore(db, postgres.StoreConfig{})
	require.NoError(t, err)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store})
	require.NoError(t, err)

	const consumer = "billing.charge-on-order-placed"
	fences := make([]driver.Fence, 2)
	for p := range fences {
		token, ok, err := store.Acquire(ctx, consumer, p, "a", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		fences[p] = driver.Fence{Partition: p, Token: token}
	}

	fenced, release, done := make(chan error, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := uow.Do(ctx, consumer, framework.Key{Source: "test", ID: "1"}, func(ctx context.Context) error {
			tx, ok := driver.TxFromContext(ctx)
			if !ok {
				fenced <- errors.New("no transaction")
				return nil
			}
			fenced <- store.Fence(ctx, tx, consumer, "a", fences)
			<-release
			return nil
		})
		done <- err
	}()
	err = <-fenced
	if err != nil {
		close(release)
		require.NoError(t, <-done)
		t.Fatalf("fence: %v", err)
	}

	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	held, renewErr := store.Renew(wait, consumer, "a", time.Minute)
	_, took, takeErr := store.Acquire(wait, consumer, 0, "b", time.Minute)
	releaseErr := store.Release(wait, consumer, 1, "a")
	close(release)
	require.NoError(t, <-done)

	require.NoError(t, renewErr, "a renewal does not wait for the fences")
	require.Equal(t, map[int]int64{0: fences[0].Token, 1: fences[1].Token}, held)
	require.NoError(t, takeErr, "a take of a lease held does not wait for its fences")
	require.False(t, took)
	require.NoError(t, releaseErr, "a release does not wait for the fences")
	leases, err := store.PartitionLeases(ctx, consumer)
	require.NoError(t, err)
	require.Equal(t, "a", leases[0].Owner)
	require.Empty(t, leases[1].Owner)
}
