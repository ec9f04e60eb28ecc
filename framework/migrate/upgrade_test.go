package migrate_test

import (
	"context"
	"io/fs"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/sqlstore"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
)

// TestUpgradeKeepsDeadLetters: a database at version 1 whose dead letters
// were stored before the history existed is migrated to the latest
// version; each dead letter's history starts with its last failure and,
// when it was resolved, its resolution, and stays replayable.
func TestUpgradeKeepsDeadLetters(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, _ := d.open(t)
			dialect, err := sqlstore.DialectOf(db.DriverName())
			require.NoError(t, err)
			upToVersion1(ctx, t, db, dialect)

			failed := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
			resolved := failed.Add(time.Hour)
			at := func(tm time.Time) any {
				if dialect == sqlstore.SQLite {
					return tm.UnixNano()
				}
				return tm
			}
			insert := db.Rebind(`INSERT INTO dead_letters (consumer, source, event_id, code, attempts, first_failed_at, last_failed_at, body, status, resolved_by, resolved_at, resolve_reason)
VALUES (?, 'shop', ?, 'invalid_payload', 3, ?, ?, ?, ?, ?, ?, ?)`)
			_, err = db.ExecContext(ctx, insert, "c", "e-1", at(failed), at(failed), []byte(`{}`), "pending", nil, nil, nil)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, insert, "c", "e-2", at(failed), at(failed), []byte(`{}`), "discarded", "ops", at(resolved), "test data")
			require.NoError(t, err)

			require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
			store := openStore(t, db, dialect)
			dls, err := store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: "c", Status: ""})
			require.NoError(t, err)
			require.Len(t, dls, 2)

			pending, err := store.DeadLetterHistory(ctx, dls[0].ID)
			require.NoError(t, err)
			require.Len(t, pending, 1)
			require.Equal(t, driver.HistoryFailed, pending[0].Kind)
			require.Equal(t, framework.CodeInvalidPayload, pending[0].Code)
			require.Equal(t, 3, pending[0].Attempts)
			require.True(t, failed.Equal(pending[0].At), "%v", pending[0].At)

			discarded, err := store.DeadLetterHistory(ctx, dls[1].ID)
			require.NoError(t, err)
			require.Len(t, discarded, 2)
			require.Equal(t, driver.HistoryDiscarded, discarded[1].Kind)
			require.Equal(t, "ops", discarded[1].By)
			require.Equal(t, "test data", discarded[1].Reason)
			require.True(t, resolved.Equal(discarded[1].At), "%v", discarded[1].At)

			_, err = store.ResolveDeadLetter(ctx, dls[0].ID, driver.Resolution{Status: driver.DeadLetterReplayed, By: "ops", Reason: "fixed"})
			require.NoError(t, err)
			replays, err := store.ClaimReplays(ctx, 10, time.Minute)
			require.NoError(t, err)
			require.Len(t, replays, 1)
			require.Equal(t, dls[0].ID, replays[0].DeadLetterID)
		})
	}
}

// upToVersion1 applies the framework's first migration alone, as a
// binary of that version did.
func upToVersion1(ctx context.Context, t *testing.T, db *sqlx.DB, d sqlstore.Dialect) {
	t.Helper()
	all, err := sqlstore.Migrations(d, "")
	require.NoError(t, err)
	first, err := fs.ReadFile(all, "00001_init.sql")
	require.NoError(t, err)
	gd := database.DialectPostgres
	if d == sqlstore.SQLite {
		gd = database.DialectSQLite3
	}
	versions, err := database.NewStore(gd, migrate.VersionTable)
	require.NoError(t, err)
	p, err := goose.NewProvider(goose.DialectCustom, db.DB, fstest.MapFS{"00001_init.sql": {Data: first}},
		goose.WithStore(versions), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.Up(ctx)
	require.NoError(t, err)
	var v int64
	require.NoError(t, db.GetContext(ctx, &v, `SELECT max(version_id) FROM `+migrate.VersionTable))
	require.EqualValues(t, 1, v)
}

// openStore returns the store of db's dialect.
func openStore(t *testing.T, db *sqlx.DB, d sqlstore.Dialect) driver.Store {
	t.Helper()
	if d == sqlstore.SQLite {
		s, err := sqlite.NewStore(db, sqlite.StoreConfig{})
		require.NoError(t, err)
		return s
	}
	s, err := postgres.NewStore(db, postgres.StoreConfig{})
	require.NoError(t, err)
	return s
}
