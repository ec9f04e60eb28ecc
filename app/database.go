package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
)

// Migrations are the application's own goose SQL migrations, applied after
// the framework's by the migrate command and by EFFECTIVELY_AUTO_MIGRATE.
// Supply them with fx.Supply(app.Migrations{FS: ...}).
type Migrations struct {
	// FS holds the migration files at its root.
	FS fs.FS
}

// openDB opens the SQLite file or PostgreSQL URL, with a pool of at most
// maxConns connections; zero is the driver's default. A SQLite file that
// does not exist is created, unless mustExist. PostgreSQL's connections
// are named after m, when set (see member).
func openDB(ctx context.Context, url string, maxConns int, mustExist bool, m member) (*sqlx.DB, error) {
	if isPostgresURL(url) {
		return postgres.Open(ctx, url, postgres.OpenConfig{MaxOpenConns: maxConns, ApplicationName: string(m)})
	}
	return sqlite.Open(ctx, url, sqlite.OpenConfig{MaxOpenConns: maxConns, MustExist: mustExist})
}

// member is the service's process's name in its partitioned consumers'
// groups (runner.Config.Member), and the application_name of its
// connections to PostgreSQL, the stores' and the transport's: a process
// that takes over a partition from this one, frozen past its lease, ends
// them (driver.SessionEnder). The operator's commands have none.
type member string

// newMember returns a new member (runner.NewMember).
func newMember() member { return member(runner.NewMember()) }

// existingDatabase, supplied, makes newDB refuse a SQLite file that does
// not exist instead of creating it: the operator's commands look into the
// service's database, and a mistyped path would leave an empty one.
type existingDatabase bool

// serviceName is the name of the service's command, as given to Command
// and Main, which supply it: messages that tell the operator what to run
// name it.
type serviceName string

// dbParams are what newDB takes from fx.
type dbParams struct {
	fx.In

	Lifecycle  fx.Lifecycle
	Config     Config
	Migrations Migrations  `optional:"true"`
	Name       serviceName `optional:"true"`
	// Build, under serve, ends when the service is asked to stop while
	// it builds.
	Build buildContext `optional:"true"`
	// Existing is set by the operator's commands.
	Existing existingDatabase `optional:"true"`
	// Member names the connections; the service's alone.
	Member member `optional:"true"`
}

// newDB opens the database of the stores (EFFECTIVELY_DATABASE_URL), with
// a pool of DatabaseMaxConns or the driver's default, which the router
// grows to what the consumers may hold (see Config.sizePool), and closes
// it when the application stops. With AutoMigrate it applies the
// framework's migrations and the application's at start. Without, it
// refuses a database that lacks one of them (see migrate.Check), naming
// the migrate command: the stores would fail on every message. A database
// ahead of the binary, migrated by a newer release, is fine.
//
// The SQL transports' tables are not migrations: the transports create
// them on first use, in the stores' database or in
// EFFECTIVELY_TRANSPORT_URL's.
func newDB(p dbParams) (*sqlx.DB, error) {
	ctx := p.Build.orBackground()
	db, err := openDB(ctx, p.Config.DatabaseURL, p.Config.DatabaseMaxConns, bool(p.Existing), p.Member)
	switch {
	case err != nil && bool(p.Existing) && errors.Is(err, fs.ErrNotExist):
		run := "the service's migrate command"
		if p.Name != "" {
			run = fmt.Sprintf("`%s migrate`", p.Name)
		}
		return nil, fmt.Errorf("database: %w: check %s; this command does not create a database, %s does", err, EnvDatabaseURL, run)
	case err != nil:
		return nil, fmt.Errorf("database: %w", err)
	}
	p.Lifecycle.Append(fx.StopHook(db.Close))
	if !bool(p.Existing) && !isPostgresURL(p.Config.DatabaseURL) {
		if err := checkWritable(ctx, db); err != nil {
			return nil, fmt.Errorf("database: %s: %w", EnvDatabaseURL, err)
		}
	}
	if p.Config.AutoMigrate {
		if err := migrateUp(ctx, db, p.Config, p.Migrations); err != nil {
			return nil, err
		}
		return db, nil
	}
	if err := checkMigrated(ctx, db, p.Config, p.Migrations, p.Name); err != nil {
		return nil, err
	}
	return db, nil
}

// checkWritable refuses a SQLite database that the process cannot write
// (opened with mode=ro, or a file it may only read): the service would
// start and report itself ready, and fail every write it makes, each
// message's mark first. It writes the database's user_version back
// unchanged in a transaction that it rolls back.
func checkWritable(ctx context.Context, db *sqlx.DB) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("check that the database is writable: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var version int64
	if err := tx.GetContext(ctx, &version, `PRAGMA user_version`); err != nil {
		return fmt.Errorf("check that the database is writable: %w", err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, version)); err != nil {
		return fmt.Errorf("the service cannot write the database (%w): open it read-write (no mode=ro) and check the file's permissions", err)
	}
	return nil
}

// migrateUp applies the framework's migrations, then the application's.
func migrateUp(ctx context.Context, db *sqlx.DB, cfg Config, m Migrations) error {
	return migrate.Up(ctx, db, migrate.Config{TablePrefix: cfg.TablePrefix, Extra: m.FS})
}

// checkMigrated returns an error that says what to run when db lacks one
// of the framework's migrations or the application's (see migrate.Check).
// name is the service's command; empty, the message says "the service's
// migrate command".
func checkMigrated(ctx context.Context, db *sqlx.DB, cfg Config, m Migrations, name serviceName) error {
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

// storeParams are what newStore takes from fx.
type storeParams struct {
	fx.In

	DB     *sqlx.DB
	Config Config
	// Resolutions, in the service, count the replays and discards.
	Resolutions *resolutions `optional:"true"`
}

// newStore returns the store of db (a sqlite.Store or a postgres.Store),
// whose tables carry the configured prefix. In the service, the replays
// and discards it records are counted (see resolutions).
func newStore(p storeParams) (driver.Store, error) {
	var (
		s         driver.Store
		err       error
		onResolve func(driver.DeadLetter, driver.Resolution)
	)
	if p.Resolutions != nil {
		onResolve = p.Resolutions.observe
	}
	if isPostgresURL(p.Config.DatabaseURL) {
		s, err = postgres.NewStore(p.DB, postgres.StoreConfig{TablePrefix: p.Config.TablePrefix, OnResolve: onResolve})
	} else {
		s, err = sqlite.NewStore(p.DB, sqlite.StoreConfig{TablePrefix: p.Config.TablePrefix, OnResolve: onResolve})
	}
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return s, nil
}
