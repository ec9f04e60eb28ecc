package migrate_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// frameworkTables are the tables the framework owns, before the prefix.
var frameworkTables = []string{
	"processed_events", "dead_letters", "outbox", "subject_checkpoints", "parked_events", "deliveries",
	"dead_letter_history", "replays", "purge_horizons", "leases", "consumer_members", "partition_leases", "bulk_jobs",
	migrate.VersionTable,
}

// dialects opens a fresh database of each dialect, and a function that
// opens another pool on the same database.
var dialects = []struct {
	name string
	open func(t *testing.T) (db *sqlx.DB, again func(t *testing.T) *sqlx.DB)
}{
	{"SQLite", func(t *testing.T) (*sqlx.DB, func(t *testing.T) *sqlx.DB) {
		path := testenv.SQLitePath(t)
		again := func(t *testing.T) *sqlx.DB {
			db, err := sqlite.Open(context.Background(), path, sqlite.OpenConfig{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			return db
		}
		return again(t), again
	}},
	{"Postgres", func(t *testing.T) (*sqlx.DB, func(t *testing.T) *sqlx.DB) {
		url := testenv.PostgresURL(t)
		again := func(t *testing.T) *sqlx.DB {
			db, err := postgres.Open(context.Background(), url, postgres.OpenConfig{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			return db
		}
		return again(t), again
	}},
}

func requireTables(t *testing.T, db *sqlx.DB, names ...string) {
	t.Helper()
	for _, name := range names {
		var n int
		require.NoError(t, db.Get(&n, "SELECT count(*) FROM "+name), "table %s", name)
	}
}

func requireNoTable(t *testing.T, db *sqlx.DB, name string) {
	t.Helper()
	var n int
	require.Error(t, db.Get(&n, "SELECT count(*) FROM "+name), "table %s exists", name)
}

func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}

// userMigrations is an application's own migration set.
func userMigrations(n int) fstest.MapFS {
	fsys := fstest.MapFS{
		"00001_customers.sql": {Data: []byte("-- +goose Up\nCREATE TABLE customers (id TEXT PRIMARY KEY);\n\n-- +goose Down\nDROP TABLE customers;\n")},
		"00002_orders.sql":    {Data: []byte("-- +goose Up\nCREATE TABLE orders (id TEXT PRIMARY KEY, customer_id TEXT NOT NULL);\n\n-- +goose Down\nDROP TABLE orders;\n")},
	}
	if n < 2 {
		delete(fsys, "00002_orders.sql")
	}
	return fsys
}

// upTogether runs Up with cfg on four pools of the database that again
// opens, at once, as processes that start together do, requires that
// each succeeded, and returns the pools.
func upTogether(ctx context.Context, t *testing.T, again func(t *testing.T) *sqlx.DB, cfg migrate.Config) []*sqlx.DB {
	t.Helper()
	dbs := make([]*sqlx.DB, 4)
	for i := range dbs {
		dbs[i] = again(t)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(dbs))
	for i, db := range dbs {
		wg.Go(func() { errs[i] = migrate.Up(ctx, db, cfg) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return dbs
}

func TestUp(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()

			t.Run("CreatesEveryTable", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				ctx := context.Background()
				require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
				requireTables(t, db, frameworkTables...)
			})

			t.Run("IsIdempotent", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				ctx := context.Background()
				cfg := migrate.Config{TablePrefix: "fx_", Extra: userMigrations(2)}
				require.NoError(t, migrate.Up(ctx, db, cfg))
				require.NoError(t, migrate.Up(ctx, db, cfg))
				st, err := migrate.Status(ctx, db, cfg)
				require.NoError(t, err)
				for _, s := range st {
					require.True(t, s.Applied, "%s %s", s.Set, s.File)
				}
				var n int
				require.NoError(t, db.Get(&n, "SELECT count(*) FROM fx_"+migrate.VersionTable+" WHERE version_id = 1"))
				require.Equal(t, 1, n)
			})

			t.Run("HonoursThePrefix", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				ctx := context.Background()
				require.NoError(t, migrate.Up(ctx, db, migrate.Config{TablePrefix: "a_"}))
				require.NoError(t, migrate.Up(ctx, db, migrate.Config{TablePrefix: "tenant_b_"}))
				requireTables(t, db, prefixed("a_", frameworkTables)...)
				requireTables(t, db, prefixed("tenant_b_", frameworkTables)...)
				requireNoTable(t, db, "processed_events")
				requireNoTable(t, db, migrate.VersionTable)
			})

			t.Run("AppliesTheApplicationsMigrations", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				ctx := context.Background()
				cfg := migrate.Config{TablePrefix: "fx_", Extra: userMigrations(1)}

				st, err := migrate.Status(ctx, db, cfg)
				require.NoError(t, err)
				require.Len(t, st, 7)
				require.Equal(t, migrate.MigrationStatus{Set: migrate.SetFramework, Version: 1, File: "00001_init.sql"}, st[0])
				require.Equal(t, migrate.MigrationStatus{Set: migrate.SetFramework, Version: 2, File: "00002_replay_history.sql"}, st[1])
				require.Equal(t, migrate.MigrationStatus{Set: migrate.SetFramework, Version: 3, File: "00003_retention.sql"}, st[2])
				require.Equal(t, migrate.MigrationStatus{Set: migrate.SetFramework, Version: 4, File: "00004_purge_by_sent_at.sql"}, st[3])
				require.Equal(t, migrate.MigrationStatus{Set: migrate.SetFramework, Version: 5, File: "00005_partitions.sql"}, st[4])
				require.Equal(t, migrate.MigrationStatus{Set: migrate.SetFramework, Version: 6, File: "00006_bulk_jobs.sql"}, st[5])
				require.Equal(t, migrate.MigrationStatus{Set: migrate.SetExtra, Version: 1, File: "00001_customers.sql"}, st[6])

				require.NoError(t, migrate.Up(ctx, db, cfg))
				requireTables(t, db, "customers", "fx_"+migrate.DefaultExtraVersionTable)
				requireNoTable(t, db, "orders")

				cfg.Extra = userMigrations(2)
				require.NoError(t, migrate.Up(ctx, db, cfg))
				requireTables(t, db, "orders")
				st, err = migrate.Status(ctx, db, cfg)
				require.NoError(t, err)
				require.Len(t, st, 8)
				for _, s := range st {
					require.True(t, s.Applied, "%s %s", s.Set, s.File)
					require.False(t, s.AppliedAt.IsZero())
				}
				require.Equal(t, migrate.SetExtra, st[7].Set)
				require.EqualValues(t, 2, st[7].Version)

				// The application's versions live in their own table.
				var n int
				require.NoError(t, db.Get(&n, "SELECT count(*) FROM fx_"+migrate.VersionTable+" WHERE version_id > 0"))
				require.Equal(t, 6, n, "the framework's table holds the framework's six versions only")
				require.NoError(t, db.Get(&n, "SELECT count(*) FROM fx_"+migrate.DefaultExtraVersionTable+" WHERE version_id > 0"))
				require.Equal(t, 2, n, "the application's table holds the application's two")
			})

			t.Run("CustomExtraVersionTable", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				ctx := context.Background()
				cfg := migrate.Config{Extra: userMigrations(1), ExtraVersionTable: "my_versions"}
				require.NoError(t, migrate.Up(ctx, db, cfg))
				requireTables(t, db, "my_versions", "customers")
			})

			t.Run("ConcurrentUpAppliesOnce", func(t *testing.T) {
				// Migrations that run again without an error, one of them
				// not repeatable: processes that migrate together apply
				// each once, and record it once.
				t.Parallel()
				extra := fstest.MapFS{
					"00001_counter.sql": {Data: []byte("-- +goose Up\nCREATE TABLE IF NOT EXISTS counter (n INTEGER NOT NULL);\n" +
						"INSERT INTO counter (n) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM counter);\n")},
					"00002_bump.sql": {Data: []byte("-- +goose Up\nUPDATE counter SET n = n + 1;\n")},
				}
				ctx := context.Background()
				for round := range 4 {
					_, again := d.open(t)
					cfg := migrate.Config{TablePrefix: fmt.Sprintf("r%d_", round), Extra: extra, ExtraVersionTable: fmt.Sprintf("r%d_versions", round)}
					dbs := upTogether(ctx, t, again, cfg)
					var n int
					require.NoError(t, dbs[0].Get(&n, "SELECT n FROM counter"))
					require.Equal(t, 1, n, "round %d: the bump applied once", round)
					for _, table := range []string{cfg.TablePrefix + migrate.VersionTable, cfg.ExtraVersionTable} {
						var dup int
						require.NoError(t, dbs[0].Get(&dup, "SELECT count(*) - count(DISTINCT version_id) FROM "+table))
						require.Zero(t, dup, "round %d: %s records each version once", round, table)
					}
				}
			})

			t.Run("ConcurrentUp", func(t *testing.T) {
				t.Parallel()
				_, again := d.open(t)
				ctx := context.Background()
				cfg := migrate.Config{TablePrefix: "c_", Extra: userMigrations(2)}
				dbs := upTogether(ctx, t, again, cfg)
				requireTables(t, dbs[0], prefixed("c_", frameworkTables)...)
				requireTables(t, dbs[0], "customers", "orders")
				var n int
				require.NoError(t, dbs[0].Get(&n, "SELECT count(*) FROM c_"+migrate.DefaultExtraVersionTable+" WHERE version_id > 0"))
				require.Equal(t, 2, n, "each migration applied once")
			})
		})
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	ctx := context.Background()

	t.Run("RejectsBadPrefix", func(t *testing.T) {
		t.Parallel()
		for _, p := range []string{"Upper_", "1st_", "dash-", "space ", "a_23456789012345678901234567890"} {
			err := migrate.Up(ctx, db, migrate.Config{TablePrefix: p})
			require.ErrorContains(t, err, "TablePrefix", p)
			require.Error(t, migrate.ValidateTablePrefix(p), p)
		}
		for _, p := range []string{"", "_", "a", "effectively_", "a_2345678901234567890123456789"} {
			require.NoError(t, migrate.ValidateTablePrefix(p), p)
		}
	})

	// The longest prefix ValidateTablePrefix accepts was refused by a
	// service with migrations of its own: the default version table of
	// Extra, prefix + app_schema_migrations, was checked as a prefix (at
	// most 30 bytes), so any prefix over 9 bytes stopped migrate and
	// every start.
	t.Run("LongestPrefixWithExtra", func(t *testing.T) {
		t.Parallel()
		const prefix = "a_2345678901234567890123456789"
		require.Len(t, prefix, migrate.MaxTablePrefixBytes)
		db := testenv.SQLite(t)
		require.NoError(t, migrate.Up(ctx, db, migrate.Config{TablePrefix: prefix, Extra: userMigrations(1)}))
		requireTables(t, db, prefix+migrate.DefaultExtraVersionTable, "customers")
		require.NoError(t, migrate.Check(ctx, db, migrate.Config{TablePrefix: prefix, Extra: userMigrations(1)}))
	})

	t.Run("RejectsBadExtraVersionTable", func(t *testing.T) {
		t.Parallel()
		for _, name := range []string{"Versions", "1st", "my-versions", strings.Repeat("v", 64)} {
			err := migrate.Up(ctx, db, migrate.Config{Extra: userMigrations(1), ExtraVersionTable: name})
			require.ErrorContains(t, err, "ExtraVersionTable", name)
		}
	})

	t.Run("RejectsEmptyExtra", func(t *testing.T) {
		t.Parallel()
		nested := fstest.MapFS{"migrations/00001_a.sql": {Data: []byte("-- +goose Up\nSELECT 1;\n")}}
		err := migrate.Up(ctx, db, migrate.Config{Extra: nested})
		require.ErrorContains(t, err, "fs.Sub")
	})

	t.Run("RejectsFrameworkVersionTableForExtra", func(t *testing.T) {
		t.Parallel()
		err := migrate.Up(ctx, db, migrate.Config{Extra: userMigrations(1), ExtraVersionTable: migrate.VersionTable})
		require.ErrorContains(t, err, "ExtraVersionTable")
	})

	t.Run("RequiresKnownDialect", func(t *testing.T) {
		t.Parallel()
		err := migrate.Up(ctx, sqlx.NewDb(db.DB, "mysql"), migrate.Config{})
		require.ErrorContains(t, err, "mysql")
		err = migrate.Up(ctx, db, migrate.Config{Dialect: "oracle"})
		require.ErrorContains(t, err, "Dialect")
		require.ErrorIs(t, migrate.Up(ctx, nil, migrate.Config{}), migrate.ErrMissingDB)
	})

	t.Run("ExplicitDialect", func(t *testing.T) {
		t.Parallel()
		other := sqlx.NewDb(sqlOf(t), "custom-sqlite-wrapper")
		require.NoError(t, migrate.Up(ctx, other, migrate.Config{Dialect: migrate.SQLite}))
		requireTables(t, other, frameworkTables...)
	})
}

func sqlOf(t *testing.T) *sql.DB { return testenv.SQLite(t).DB }

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()

			t.Run("UnmigratedIsBehind", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				err := migrate.Check(context.Background(), db, migrate.Config{TablePrefix: "u_"})
				var behind *migrate.BehindError
				require.ErrorAs(t, err, &behind)
				require.Equal(t, &migrate.BehindError{Set: migrate.SetFramework, Version: 0, Needed: 6, Missing: []int64{1, 2, 3, 4, 5, 6}}, behind)
				require.EqualError(t, err, "database schema is at version 0, this binary needs 6")
				requireNoTable(t, db, "u_"+migrate.VersionTable) // it changes nothing
			})

			t.Run("MigratedPasses", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				ctx := context.Background()
				cfg := migrate.Config{Extra: userMigrations(2)}
				require.NoError(t, migrate.Up(ctx, db, cfg))
				require.NoError(t, migrate.Check(ctx, db, cfg))
			})

			t.Run("AheadPasses", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				ctx := context.Background()
				require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
				// A newer release applied a migration this binary does not ship.
				_, err := db.Exec(`INSERT INTO ` + migrate.VersionTable + ` (version_id, is_applied) VALUES (99, true)`)
				require.NoError(t, err)
				require.NoError(t, migrate.Check(ctx, db, migrate.Config{}))
			})

			t.Run("MissingVersionBelowTheLatestIsBehind", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				ctx := context.Background()
				require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
				_, err := db.Exec(`INSERT INTO ` + migrate.VersionTable + ` (version_id, is_applied) VALUES (99, true)`)
				require.NoError(t, err)
				_, err = db.Exec(`DELETE FROM ` + migrate.VersionTable + ` WHERE version_id = 1`)
				require.NoError(t, err)
				err = migrate.Check(ctx, db, migrate.Config{})
				require.EqualError(t, err, "database schema is at version 99 but lacks version 1, which this binary needs")
			})

			t.Run("ApplicationsMigrationsBehind", func(t *testing.T) {
				t.Parallel()
				db, _ := d.open(t)
				ctx := context.Background()
				require.NoError(t, migrate.Up(ctx, db, migrate.Config{Extra: userMigrations(1)}))
				err := migrate.Check(ctx, db, migrate.Config{Extra: userMigrations(2)})
				var behind *migrate.BehindError
				require.ErrorAs(t, err, &behind)
				require.Equal(t, &migrate.BehindError{Set: migrate.SetExtra, Version: 1, Needed: 2, Missing: []int64{2}}, behind)
				require.EqualError(t, err, "the application's database schema is at version 1, this binary needs 2")
			})
		})
	}
}
