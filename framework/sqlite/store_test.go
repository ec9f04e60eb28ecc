package sqlite_test

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/framework/storetest"
	"github.com/effectively-once/effectively/internal/testenv"
)

func TestStore(t *testing.T) {
	t.Parallel()
	harness := func(t *testing.T) storetest.Harness {
		db := testenv.SQLite(t)
		return storetest.Harness{
			DB: db,
			NewStore: func(t *testing.T, cfg storetest.Config) framework.Store {
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
