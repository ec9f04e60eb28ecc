package sqlite_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/driver/storetest"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

func TestStore(t *testing.T) {
	t.Parallel()
	harness := func(t *testing.T) storetest.Harness {
		db := testenv.SQLite(t)
		return storetest.Harness{
			DB: db,
			NewStore: func(t *testing.T, cfg storetest.Config) driver.Store {
				err := migrate.Up(context.Background(), db, migrate.Config{TablePrefix: cfg.TablePrefix})
				require.NoError(t, err)
				s, err := sqlite.NewStore(db, sqlite.StoreConfig{TablePrefix: cfg.TablePrefix, Now: cfg.Now})
				require.NoError(t, err)
				return s
			},
		}
	}
	storetest.Exercise(t, harness)
	storetest.ExerciseInspector(t, harness)
}

func TestNewStoreValidates(t *testing.T) {
	t.Parallel()
	_, err := sqlite.NewStore(nil, sqlite.StoreConfig{})
	require.ErrorIs(t, err, sqlite.ErrMissingDB)
	_, err = sqlite.NewStore(testenv.SQLite(t), sqlite.StoreConfig{TablePrefix: "Bad-Prefix"})
	require.ErrorContains(t, err, "TablePrefix")
	_, err = sqlite.NewStore(sqlx.NewDb(testenv.SQLite(t).DB, "pgx"), sqlite.StoreConfig{})
	require.ErrorContains(t, err, "not sqlite")
}

// TestClaimReplaysIdleTakesNoWriteLock: the service's replay relay polls
// the replays; a poll that finds none writes nothing, so it does not wait
// for (or take) SQLite's write lock, which another connection holds here.
func TestClaimReplaysIdleTakesNoWriteLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := testenv.SQLitePath(t)
	db, err := sqlite.Open(ctx, path, sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)

	other, err := sqlite.Open(ctx, path, sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	writer, err := other.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = writer.Close() })
	_, err = writer.ExecContext(ctx, `BEGIN IMMEDIATE`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = writer.ExecContext(ctx, `ROLLBACK`) })

	claimCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rs, err := store.ClaimReplays(claimCtx, 10, time.Minute)
	require.NoError(t, err, "an idle poll must not wait for the write lock")
	require.Empty(t, rs)
}

// TestCountUnstorableText: SQLite stores text that is not UTF-8, or holds
// NUL, as it is (PostgreSQL refuses it); such keys are counted, alone and
// with others at once, as exactly as any.
func TestCountUnstorableText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.SQLite(t)
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	s, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	keys := []framework.Key{{Source: "s", ID: "bad\xffutf8"}, {Source: "s", ID: "nul\x00byte"}, {Source: "s", ID: "bad\xfe"}, {Source: "s", ID: "plain"}}
	for round := 1; round <= 2; round++ {
		var wg sync.WaitGroup
		counts := make([]int, len(keys))
		errs := make([]error, len(keys))
		for i, k := range keys {
			wg.Go(func() { counts[i], errs[i] = s.Count(ctx, "c", k, 1) })
		}
		wg.Wait()
		require.Equal(t, make([]error, len(keys)), errs)
		require.Equal(t, []int{round, round, round, round}, counts)
	}
}
