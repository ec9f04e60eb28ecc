package driver_test

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestConn: framework.Conn, which knows nothing of the unit of work,
// returns the attempt's *driver.Tx inside an attempt with a database, and
// the database given outside one and inside an attempt without a database
// (the in-memory store); IdempotencyKeyFromContext reads the same attempt.
func TestConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := framework.Key{Source: "appointments", ID: "e1"}

	t.Run("WithDatabase", func(t *testing.T) {
		t.Parallel()
		db := testenv.SQLite(t)
		require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
		store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
		require.NoError(t, err)
		uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store, BatchSize: 1})
		require.NoError(t, err)
		require.Same(t, db, framework.Conn(ctx, db), "outside an attempt")
		var got sqlx.ExtContext
		outcome, err := uow.Do(ctx, "c", key, func(ctx context.Context) error {
			got = framework.Conn(ctx, db)
			tx, ok := driver.TxFromContext(ctx)
			require.True(t, ok)
			require.Same(t, tx, got, "the attempt's transaction")
			ik, ok := framework.IdempotencyKeyFromContext(ctx)
			require.True(t, ok)
			require.Equal(t, framework.IdempotencyKey("c", key), ik)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, framework.Processed, outcome)
		require.IsType(t, &driver.Tx{}, got)
	})

	t.Run("WithoutDatabase", func(t *testing.T) {
		t.Parallel()
		db := testenv.SQLite(t)
		store, err := memory.NewStore(memory.StoreConfig{})
		require.NoError(t, err)
		uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{Store: store})
		require.NoError(t, err)
		_, err = uow.Do(ctx, "c", key, func(ctx context.Context) error {
			require.Same(t, db, framework.Conn(ctx, db), "no transaction to join")
			_, ok := framework.IdempotencyKeyFromContext(ctx)
			require.True(t, ok)
			return nil
		})
		require.NoError(t, err)
	})
}
