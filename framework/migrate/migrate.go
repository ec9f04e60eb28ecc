package migrate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// Dialect names the database the migrations are written for.
type Dialect string

// The supported dialects.
const (
	Postgres Dialect = Dialect(sqlstore.Postgres)
	SQLite   Dialect = Dialect(sqlstore.SQLite)
)

// MaxTablePrefixBytes is the longest table prefix.
const MaxTablePrefixBytes = sqlstore.MaxPrefixBytes

// VersionTable is the name, after the table prefix, of the table that
// records which of the framework's migrations are applied.
const VersionTable = sqlstore.VersionTable

// DefaultExtraVersionTable is the name, after the table prefix, of the
// table that records which of the application's migrations (Config.Extra)
// are applied.
const DefaultExtraVersionTable = "app_schema_migrations"

// The names of the two sets of migrations, as Status reports them.
const (
	// SetFramework is the framework's own migrations.
	SetFramework = "effectively"
	// SetExtra is the application's migrations, Config.Extra.
	SetExtra = "app"
)

// ValidateTablePrefix reports whether prefix can prefix the framework's
// table names: empty, or at most MaxTablePrefixBytes bytes matching
// ^[a-z_][a-z0-9_]*$.
func ValidateTablePrefix(prefix string) error { return sqlstore.ValidatePrefix(prefix) }

// Config configures Up and Status.
type Config struct {
	// Dialect is the database's dialect. Defaults to the one the driver
	// name of the database implies ("pgx" and "postgres" are Postgres,
	// "sqlite" and "sqlite3" SQLite).
	Dialect Dialect
	// TablePrefix prefixes the name of every table the framework owns,
	// including its version tables; see ValidateTablePrefix. Defaults to
	// none.
	TablePrefix string
	// Extra holds the application's own goose SQL migrations
	// (NNNNN_name.sql with "-- +goose Up" annotations) at its root; use
	// fs.Sub for a folder of an embed.FS. They run after the framework's,
	// so they may refer to its tables, and are recorded in a version table
	// of their own. Defaults to none.
	Extra fs.FS
	// ExtraVersionTable names the table that records which of Extra's
	// migrations are applied: at most 63 bytes of lower-case letters,
	// digits and underscores, not starting with a digit. Defaults to
	// TablePrefix + DefaultExtraVersionTable.
	ExtraVersionTable string
	// Logger receives a line per migration applied. Defaults to discarding.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their
// defaults, except Dialect, which comes from the database.
func (c Config) WithDefaults() Config {
	c.ExtraVersionTable = cmp.Or(c.ExtraVersionTable, c.TablePrefix+DefaultExtraVersionTable)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	if c.Dialect != "" {
		if err := sqlstore.Dialect(c.Dialect).Validate(); err != nil {
			return fmt.Errorf("migrate: Dialect: %w", err)
		}
	}
	if err := sqlstore.ValidatePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("migrate: TablePrefix: %w", err)
	}
	if c.ExtraVersionTable != "" {
		// A table name, not a prefix: TablePrefix + DefaultExtraVersionTable
		// must fit for every prefix ValidateTablePrefix accepts.
		if err := sqlstore.ValidateTableName(c.ExtraVersionTable); err != nil {
			return fmt.Errorf("migrate: ExtraVersionTable: %w", err)
		}
	}
	if c.ExtraVersionTable == c.TablePrefix+VersionTable {
		return fmt.Errorf("migrate: ExtraVersionTable %q is the framework's version table: choose another name", c.ExtraVersionTable)
	}
	return nil
}

// ErrMissingDB is returned without a database.
var ErrMissingDB = errors.New("migrate: missing database (try sqlite.Open or postgres.Open)")

// Up applies the framework's migrations that are not applied yet, then
// the application's (Config.Extra). Running it again does nothing.
//
// Processes that start together may run Up together. On PostgreSQL each
// set is applied under a session advisory lock keyed by the schema and the
// set's version table, so the others wait and then find nothing to do. On
// SQLite Up holds an exclusive lock on a file beside the database's
// (its path and LockSuffix) while it reads and applies, so the others
// wait the same way: each migration is applied once, even one that is
// not idempotent. Besides, when a migration fails after another process
// applied migrations meanwhile (one without that lock: a release before
// it, or a system without flock), Up reads the list again and goes on,
// and it returns the error when no other process made progress.
func Up(ctx context.Context, db *sqlx.DB, cfg Config) error {
	sets, err := providers(db, cfg)
	if err != nil {
		return err
	}
	unlock, err := lockSQLite(ctx, db, sets[0].dialect)
	if err != nil {
		return err
	}
	defer unlock()
	for _, s := range sets {
		if err := s.up(ctx); err != nil {
			return fmt.Errorf("migrate %s: %w", s.name, err)
		}
	}
	return nil
}

// LockSuffix follows the path of a SQLite database in the name of the
// file that Up locks while it migrates the database: a file of no
// content, left in place.
const LockSuffix = "-migrate.lock"

// lockSQLite takes the lock of Up on the SQLite database db (see
// LockSuffix) and returns the function that releases it; on PostgreSQL,
// and for a database in memory, it takes none.
func lockSQLite(ctx context.Context, db *sqlx.DB, d sqlstore.Dialect) (unlock func(), err error) {
	if d != sqlstore.SQLite {
		return func() {}, nil
	}
	var path string
	if err := db.GetContext(ctx, &path, `SELECT file FROM pragma_database_list WHERE name = 'main'`); err != nil {
		return nil, fmt.Errorf("migrate: the database's file: %w", err)
	}
	if path == "" {
		return func() {}, nil // in memory: no other process shares it
	}
	return lockFile(ctx, path+LockSuffix)
}

func (s set) up(ctx context.Context) error {
	for {
		before, err := s.provider.GetDBVersion(ctx)
		if err != nil {
			return err
		}
		results, err := s.provider.Up(ctx)
		for _, r := range results {
			if r.Error == nil {
				s.logger.InfoContext(ctx, "migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
			}
		}
		if err == nil {
			return nil
		}
		after, verr := s.provider.GetDBVersion(ctx)
		if verr != nil || after <= before {
			return err
		}
		s.logger.InfoContext(ctx, "migrations applied concurrently; reading them again", "version", after)
	}
}

// MigrationStatus says whether one migration is applied.
type MigrationStatus struct {
	// Set is SetFramework or SetExtra.
	Set string
	// Version is the number the file name starts with.
	Version int64
	// File is the migration's file name.
	File string
	// Applied reports whether the migration is applied, and AppliedAt
	// when.
	Applied   bool
	AppliedAt time.Time
}

// Status lists every migration of the framework, then the application's,
// in the order Up applies them, each with whether it is applied. It
// creates the version tables when they are missing but changes nothing
// else.
func Status(ctx context.Context, db *sqlx.DB, cfg Config) ([]MigrationStatus, error) {
	sets, err := providers(db, cfg)
	if err != nil {
		return nil, err
	}
	var out []MigrationStatus
	for _, s := range sets {
		st, err := s.provider.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("migration status of %s: %w", s.name, err)
		}
		for _, m := range st {
			out = append(out, MigrationStatus{
				Set:       s.name,
				Version:   m.Source.Version,
				File:      m.Source.Path,
				Applied:   m.State == goose.StateApplied,
				AppliedAt: m.AppliedAt,
			})
		}
	}
	return out, nil
}

// BehindError reports a database that lacks migrations this binary ships
// (see Check).
type BehindError struct {
	// Set is SetFramework or SetExtra.
	Set string
	// Version is the highest version applied to the database; 0 when none
	// is.
	Version int64
	// Needed is the highest version this binary ships.
	Needed int64
	// Missing lists the versions this binary ships that are not applied,
	// in order.
	Missing []int64
}

// Error says how far behind the database is.
func (e *BehindError) Error() string {
	what := "database schema"
	if e.Set == SetExtra {
		what = "the application's database schema"
	}
	if e.Version < e.Needed {
		return fmt.Sprintf("%s is at version %d, this binary needs %d", what, e.Version, e.Needed)
	}
	missing := make([]string, len(e.Missing))
	for i, v := range e.Missing {
		missing[i] = strconv.FormatInt(v, 10)
	}
	return fmt.Sprintf("%s is at version %d but lacks version %s, which this binary needs", what, e.Version, strings.Join(missing, ", "))
}

// Check reports whether every migration this binary ships, the framework's
// and then the application's (Config.Extra), is applied to db, without
// changing anything: it returns a *BehindError for the first set that
// lacks one. A database ahead of the binary, with versions it does not
// ship (applied by a newer release during a rolling deploy), passes.
func Check(ctx context.Context, db *sqlx.DB, cfg Config) error {
	sets, err := providers(db, cfg)
	if err != nil {
		return err
	}
	for _, s := range sets {
		if err := s.check(ctx, db); err != nil {
			return err
		}
	}
	return nil
}

// check returns a *BehindError when a migration of s is not applied.
func (s set) check(ctx context.Context, db *sqlx.DB) error {
	applied := make(map[int64]bool)
	var version int64
	exists, err := sqlstore.TableExists(ctx, db.DB, s.dialect, s.store.Tablename())
	if err != nil {
		return fmt.Errorf("check migrations of %s: %w", s.name, err)
	}
	if exists {
		rows, err := s.store.ListMigrations(ctx, db.DB)
		if err != nil {
			return fmt.Errorf("check migrations of %s: %w", s.name, err)
		}
		seen := make(map[int64]bool)
		for _, r := range rows { // the latest row of each version first
			if seen[r.Version] {
				continue
			}
			seen[r.Version] = true
			if r.IsApplied {
				applied[r.Version] = true
				version = max(version, r.Version)
			}
		}
	}
	behind := &BehindError{Set: s.name, Version: version}
	for _, src := range s.provider.ListSources() {
		behind.Needed = max(behind.Needed, src.Version)
		if !applied[src.Version] {
			behind.Missing = append(behind.Missing, src.Version)
		}
	}
	if len(behind.Missing) > 0 {
		return behind
	}
	return nil
}

type set struct {
	name     string
	provider *goose.Provider
	store    database.Store // the provider's version table
	dialect  sqlstore.Dialect
	logger   *slog.Logger
}

func providers(db *sqlx.DB, cfg Config) ([]set, error) {
	if db == nil {
		return nil, ErrMissingDB
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := sqlstore.Dialect(cfg.Dialect)
	if d == "" {
		var err error
		if d, err = sqlstore.DialectOf(db.DriverName()); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	own, err := sqlstore.Migrations(d, cfg.TablePrefix)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	sets := []set{{name: SetFramework, dialect: d, logger: cfg.Logger.With("migrations", SetFramework)}}
	if sets[0].provider, sets[0].store, err = newProvider(db, d, own, cfg.TablePrefix+VersionTable, sets[0].logger); err != nil {
		return nil, fmt.Errorf("migrate %s: %w", SetFramework, err)
	}
	if cfg.Extra != nil {
		s := set{name: SetExtra, dialect: d, logger: cfg.Logger.With("migrations", SetExtra)}
		if s.provider, s.store, err = newProvider(db, d, cfg.Extra, cfg.ExtraVersionTable, s.logger); err != nil {
			if errors.Is(err, goose.ErrNoMigrations) {
				err = fmt.Errorf("%w at the root of Extra (for a folder of an embed.FS, pass fs.Sub(fsys, \"migrations\"))", err)
			}
			return nil, fmt.Errorf("migrate %s: %w", SetExtra, err)
		}
		sets = append(sets, s)
	}
	return sets, nil
}

func newProvider(db *sqlx.DB, d sqlstore.Dialect, fsys fs.FS, versionTable string, logger *slog.Logger) (*goose.Provider, database.Store, error) {
	gd := database.DialectPostgres
	if d == sqlstore.SQLite {
		gd = database.DialectSQLite3
	}
	store, err := database.NewStore(gd, versionTable)
	if err != nil {
		return nil, nil, fmt.Errorf("version table %s: %w", versionTable, err)
	}
	opts := []goose.ProviderOption{
		goose.WithStore(store),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(logger),
	}
	if l := sqlstore.Locker(d, versionTable); l != nil {
		opts = append(opts, goose.WithSessionLocker(l))
	}
	p, err := goose.NewProvider(goose.DialectCustom, db.DB, fsys, opts...)
	return p, store, err
}
