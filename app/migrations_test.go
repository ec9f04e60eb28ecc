package app_test

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
)

// openConfigured opens the database cfg names, closed when the test ends.
func openConfigured(t *testing.T, url string) *sqlx.DB {
	t.Helper()
	ctx := context.Background()
	var (
		db  *sqlx.DB
		err error
	)
	if strings.HasPrefix(url, "postgres://") {
		db, err = postgres.Open(ctx, url, postgres.OpenConfig{})
	} else {
		db, err = sqlite.Open(ctx, url, sqlite.OpenConfig{})
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// newAddWidgetRebound is newAddWidget with the database's placeholders.
func newAddWidgetRebound(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
	return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO widgets (name, event_id) VALUES (?, ?)`), ev.Data.Name, ev.ID)
		return err
	}
}

// TestStartChecksMigrations starts the service without
// EFFECTIVELY_AUTO_MIGRATE on databases migrated or not, on SQLite and
// PostgreSQL.
func TestStartChecksMigrations(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config func(t *testing.T) app.Config
		// transportURL returns a fresh database of the same kind.
		transportURL func(t *testing.T) string
	}{
		{"SQLite", testConfig, func(t *testing.T) string { return filepath.Join(t.TempDir(), "transport.db") }},
		{"Postgres", postgresConfig, func(t *testing.T) string { return testenv.PostgresURL(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			config := func(t *testing.T) app.Config {
				cfg := tc.config(t)
				cfg.AutoMigrate = false
				return cfg
			}
			newService := func(cfg app.Config, opts ...fx.Option) *fx.App {
				return app.New(
					handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidgetRebound)),
					fx.Supply(widgetMigrations, app.ServiceName("widgets")),
					fx.Replace(cfg),
					fx.Options(opts...),
				)
			}
			migrated := func(t *testing.T, cfg app.Config) *sqlx.DB {
				db := openConfigured(t, cfg.DatabaseURL)
				require.NoError(t, app.Migrate(context.Background(), db, cfg, widgetMigrations))
				return db
			}
			consumes := func(t *testing.T, cfg app.Config) {
				b := &bundle{cfg: cfg}
				b.service = newService(cfg, fx.Populate(&b.db, &b.transport))
				b.start(t)
				b.publish(t, "w-1", "sprocket")
				waitFor(t, "the widget", func() bool {
					return b.count(t, `SELECT count(*) FROM widgets`) == 1
				})
			}

			t.Run("UnmigratedIsRefused", func(t *testing.T) {
				t.Parallel()
				cfg := config(t)
				err := newService(cfg).Err()
				require.ErrorContains(t, err, "database schema is at version 0, this binary needs 6: run `widgets migrate` or set EFFECTIVELY_AUTO_MIGRATE=true")
				var n int
				db := openConfigured(t, cfg.DatabaseURL)
				require.Error(t, db.Get(&n, `SELECT count(*) FROM `+migrate.VersionTable), "the check created nothing")
			})

			t.Run("ApplicationsMigrationsBehindIsRefused", func(t *testing.T) {
				t.Parallel()
				cfg := config(t)
				db := openConfigured(t, cfg.DatabaseURL)
				require.NoError(t, app.Migrate(context.Background(), db, cfg, app.Migrations{}))
				err := newService(cfg).Err()
				require.ErrorContains(t, err, "the application's database schema is at version 0, this binary needs 1: run `widgets migrate`")
			})

			t.Run("MigratedStarts", func(t *testing.T) {
				t.Parallel()
				cfg := config(t)
				migrated(t, cfg)
				consumes(t, cfg)
			})

			t.Run("AheadStarts", func(t *testing.T) {
				t.Parallel()
				cfg := config(t)
				db := migrated(t, cfg)
				// A newer release applied a migration of its own.
				_, err := db.Exec(`INSERT INTO ` + migrate.VersionTable + ` (version_id, is_applied) VALUES (99, true)`)
				require.NoError(t, err)
				consumes(t, cfg)
			})

			t.Run("TransportDatabaseNeedsNoMigration", func(t *testing.T) {
				t.Parallel()
				// The SQL transports create their tables on first use.
				cfg := config(t)
				cfg.TransportURL = tc.transportURL(t)
				migrated(t, cfg)
				consumes(t, cfg)
			})
		})
	}
}

// TestStartRefusesReadOnlySQLite: a migrated SQLite database opened
// read-only (mode=ro) is refused at start, naming the setting, where the
// service started and reported itself ready, and failed every write.
func TestStartRefusesReadOnlySQLite(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.AutoMigrate = false
	db := openConfigured(t, cfg.DatabaseURL)
	require.NoError(t, app.Migrate(context.Background(), db, cfg, widgetMigrations))
	cfg.DatabaseURL = "file:" + strings.TrimPrefix(cfg.DatabaseURL, "file:") + "?mode=ro"
	err := app.New(
		handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidgetRebound)),
		fx.Supply(widgetMigrations, app.ServiceName("widgets")),
		fx.Replace(cfg),
	).Err()
	require.ErrorContains(t, err, "EFFECTIVELY_DATABASE_URL: the service cannot write the database (")
	require.ErrorContains(t, err, "readonly database")
}

// TestServeCommandRefusesUnmigratedDatabase runs `widgets serve` on an
// unmigrated database, configured by the environment as in production: it
// fails at once naming the migrate command. It sets the environment, so it
// does not run in parallel.
func TestServeCommandRefusesUnmigratedDatabase(t *testing.T) {
	t.Setenv(app.EnvDatabaseURL, filepath.Join(t.TempDir(), "app.db"))
	t.Setenv(app.EnvTransport, "")
	t.Setenv(app.EnvTransportURL, "")
	t.Setenv(app.EnvConfig, "")
	t.Setenv(app.EnvAutoMigrate, "")
	t.Setenv(app.EnvTablePrefix, "")
	t.Setenv(app.EnvHTTPAddr, "127.0.0.1:0")
	cmd := app.Command("widgets", fx.Options(
		handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
		fx.Supply(widgetMigrations),
	))
	cmd.SetArgs([]string{"serve"})
	cmd.SetOut(io.Discard)
	err := cmd.ExecuteContext(context.Background())
	require.ErrorContains(t, err, "run `widgets migrate` or set EFFECTIVELY_AUTO_MIGRATE=true")
}
