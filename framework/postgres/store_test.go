package postgres_test

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/driver/storetest"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

func TestStore(t *testing.T) {
	t.Parallel()
	harness := func(t *testing.T) storetest.Harness {
		db := testenv.Postgres(t)
		return storetest.Harness{
			DB: db,
			NewStore: func(t *testing.T, cfg storetest.Config) driver.Store {
				err := migrate.Up(context.Background(), db, migrate.Config{TablePrefix: cfg.TablePrefix})
				require.NoError(t, err)
				s, err := postgres.NewStore(db, postgres.StoreConfig{TablePrefix: cfg.TablePrefix, Now: cfg.Now})
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
	_, err := postgres.NewStore(nil, postgres.StoreConfig{})
	require.ErrorIs(t, err, postgres.ErrMissingDB)
	_, err = postgres.NewStore(testenv.Postgres(t), postgres.StoreConfig{TablePrefix: "Bad-Prefix"})
	require.ErrorContains(t, err, "TablePrefix")
	_, err = postgres.NewStore(sqlx.NewDb(testenv.Postgres(t).DB, "sqlite"), postgres.StoreConfig{})
	require.ErrorContains(t, err, "not postgres")
}
