package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/handlers"
)

// Migrations are the application's own goose SQL migrations, applied after
// the framework's by the migrate command and by EFFECTIVELY_AUTO_MIGRATE.
// Supply them with fx.Supply(app.Migrations{FS: ...}).
type Migrations struct {
	// FS holds the migration files at its root.
	FS fs.FS
}

// openDB opens the SQLite file or PostgreSQL URL, with a pool of at most
// maxConns connections; zero is the driver's default.
func openDB(ctx context.Context, url string, maxConns int) (*sqlx.DB, error) {
	if isPostgresURL(url) {
		return postgres.Open(ctx, url, postgres.OpenConfig{MaxOpenConns: maxConns})
	}
	return sqlite.Open(ctx, url, sqlite.OpenConfig{MaxOpenConns: maxConns})
}

// ServiceName is the name of the service's command, as given to Command
// and Main, which supply it: messages that tell the operator what to run
// name it.
type ServiceName string

// DBParams are what NewDB takes from fx.
type DBParams struct {
	fx.In

	Lifecycle  fx.Lifecycle
	Config     Config
	Migrations Migrations  `optional:"true"`
	Name       ServiceName `optional:"true"`
	// Declarations, the consumers declared with handlers.Consumer, size
	// the pool (see Config.DatabasePoolSize).
	Declarations []handlers.Declaration `group:"effectively.consumers"`
}

// NewDB opens the database of the stores (EFFECTIVELY_DATABASE_URL), with a
// pool sized for the declared consumers (see Config.DatabasePoolSize), and
// closes it when the application stops. With AutoMigrate it applies the
// framework's migrations and the application's at start. Without, it
// refuses a database that lacks one of them (see migrate.Check), naming
// the migrate command: the stores would fail on every message. A database
// ahead of the binary, migrated by a newer release, is fine.
//
// The SQL transports' tables are not migrations: the transports create
// them on first use, in the stores' database or in
// EFFECTIVELY_TRANSPORT_URL's.
func NewDB(p DBParams) (*sqlx.DB, error) {
	ctx := context.Background()
	size, err := p.Config.DatabasePoolSize(p.Declarations)
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	db, err := openDB(ctx, p.Config.DatabaseURL, size)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	p.Lifecycle.Append(fx.StopHook(db.Close))
	if p.Config.AutoMigrate {
		if err := Migrate(ctx, db, p.Config, p.Migrations); err != nil {
			return nil, err
		}
		return db, nil
	}
	if err := checkMigrated(ctx, db, p.Config, p.Migrations, p.Name); err != nil {
		return nil, err
	}
	return db, nil
}

// Migrate applies the framework's migrations, then the application's.
func Migrate(ctx context.Context, db *sqlx.DB, cfg Config, m Migrations) error {
	return migrate.Up(ctx, db, migrate.Config{TablePrefix: cfg.TablePrefix, Extra: m.FS})
}

// checkMigrated returns an error that says what to run when db lacks one
// of the framework's migrations or the application's (see migrate.Check).
// name is the service's command; empty, the message says "the service's
// migrate command".
func checkMigrated(ctx context.Context, db *sqlx.DB, cfg Config, m Migrations, name ServiceName) error {
	err := migrate.Check(ctx, db, migrate.Config{TablePrefix: cfg.TablePrefix, Extra: m.FS})
	var behind *migrate.BehindError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &behind):
		run := "the service's migrate command"
		if name != "" {
			run = fmt.Sprintf("`%s migrate`", name)
		}
		return fmt.Errorf("database: %w: run %s or set %s=true", err, run, EnvAutoMigrate)
	default:
		return fmt.Errorf("database: %w", err)
	}
}

// Store is the framework's store in the configured database: every store
// interface of package framework in one value (a sqlite.Store or a
// postgres.Store).
type Store interface {
	framework.Store
}

// NewStore returns the store of db, whose tables carry the configured
// prefix.
func NewStore(db *sqlx.DB, cfg Config) (Store, error) {
	var (
		s   Store
		err error
	)
	if isPostgresURL(cfg.DatabaseURL) {
		s, err = postgres.NewStore(db, postgres.StoreConfig{TablePrefix: cfg.TablePrefix})
	} else {
		s, err = sqlite.NewStore(db, sqlite.StoreConfig{TablePrefix: cfg.TablePrefix})
	}
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return s, nil
}
