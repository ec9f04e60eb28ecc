package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

func TestOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("BoundsThePool", func(t *testing.T) {
		t.Parallel()
		db, err := postgres.Open(ctx, testenv.PostgresURL(t), postgres.OpenConfig{MaxOpenConns: 3})
		require.NoError(t, err)
		defer db.Close()
		require.Equal(t, 3, db.Stats().MaxOpenConnections)
		require.Equal(t, postgres.DriverName, db.DriverName())
	})

	t.Run("DefaultsThePool", func(t *testing.T) {
		t.Parallel()
		db, err := postgres.Open(ctx, testenv.PostgresURL(t), postgres.OpenConfig{})
		require.NoError(t, err)
		defer db.Close()
		require.Equal(t, postgres.DefaultMaxOpenConns, db.Stats().MaxOpenConnections)
	})

	t.Run("PingsTheServer", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := postgres.Open(ctx, "postgres://nobody:wrong@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", postgres.OpenConfig{})
		require.ErrorContains(t, err, "ping")
		require.NotContains(t, err.Error(), "wrong", "the password stays out of the error")
	})

	t.Run("Validates", func(t *testing.T) {
		t.Parallel()
		_, err := postgres.Open(ctx, "", postgres.OpenConfig{})
		require.ErrorIs(t, err, postgres.ErrEmptyURL)
		_, err = postgres.Open(ctx, "postgres://x", postgres.OpenConfig{MaxOpenConns: -1})
		require.ErrorContains(t, err, "MaxOpenConns")
		_, err = postgres.Open(ctx, "postgres://x", postgres.OpenConfig{MaxOpenConns: 2, MaxIdleConns: 3})
		require.ErrorContains(t, err, "MaxIdleConns")
	})
}
