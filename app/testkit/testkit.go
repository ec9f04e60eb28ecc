package testkit

import (
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/keypath"
	"github.com/effectively-once/effectively/internal/pgschema"
	"github.com/effectively-once/effectively/middleware"
)

// Defaults of Config: fast retries, so that a test of a failing handler
// takes milliseconds, and a time limit that fails a stuck handler's test
// well before the test binary's own.
const (
	DefaultAttempts   = middleware.DefaultAttempts
	DefaultRetryDelay = time.Millisecond
	DefaultTimeout    = 10 * time.Second
)

// SQLiteFile is the name of the SQLite file New creates in t.TempDir().
const SQLiteFile = "effectively.db"

// setupTimeout bounds opening, migrating and dropping a test database.
const setupTimeout = time.Minute

// Config configures a Kit. The zero value runs on a fresh SQLite file with
// the framework's tables only.
type Config struct {
	// PostgresURL, when set, runs the kit on PostgreSQL instead of SQLite:
	// New creates a schema of the test's own on that server, points every
	// connection at it (search_path in the URL) and drops it at cleanup,
	// so parallel tests never see each other's rows. It must be a
	// postgres:// or postgresql:// URL. A test that runs everywhere sets
	// it from the environment and gets SQLite where it is empty:
	//
	//	testkit.Config{PostgresURL: os.Getenv("EFFECTIVELY_TEST_POSTGRES_URL")}
	//
	// Defaults to empty: SQLite.
	PostgresURL string
	// Migrations holds the application's own goose SQL migrations
	// (NNNNN_name.sql with "-- +goose Up") at its root, applied after the
	// framework's (migrate.Config.Extra); use fs.Sub for a folder of an
	// embed.FS. Defaults to none.
	Migrations fs.FS
	// TablePrefix prefixes the framework's tables, as
	// EFFECTIVELY_TABLE_PREFIX does in the app. Defaults to none.
	TablePrefix string
	// Settings are the consumers' settings, as the app's consumers: and
	// defaults: entries (see middleware.Settings): retries, time limits,
	// ordering, group commit (BatchSize, Batches, BatchLinger: with a long
	// linger, BatchSize deliveries made together, see DeliverTogether,
	// share one transaction for sure, unless their handlers wait outside
	// the database, which makes them overlap on PostgreSQL: Overlap 1
	// keeps them in batches), rate limit and breaker. Zero
	// fields take the kit's defaults (Attempts DefaultAttempts, RetryDelay
	// DefaultRetryDelay, Timeout DefaultTimeout), then middleware's.
	// Under StrictOrder, an event ahead of its turn is Nacked, to be
	// delivered again, until GapTimeout after its first wait; then it is
	// dead-lettered with code sequence_gap.
	middleware.Settings
	// Logger receives the chain's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Attempts = cmp.Or(c.Attempts, DefaultAttempts)
	c.RetryDelay = cmp.Or(c.RetryDelay, DefaultRetryDelay)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.Settings = c.Settings.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the invalid fields of c, each setting named
// Config.Settings.<key> (see middleware.Settings.Validate).
func (c Config) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("testkit: %w", err)
	}
	return nil
}

// validate is Validate without the package's prefix, for New, whose
// failure adds it.
func (c Config) validate() error {
	if err := c.Settings.Validate(); err != nil {
		return keypath.Prefix("Config.Settings", err)
	}
	if err := migrate.ValidateTablePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("TablePrefix: %w", err)
	}
	if c.PostgresURL != "" {
		if err := pgschema.CheckURL(c.PostgresURL); err != nil {
			return fmt.Errorf("PostgresURL: %w", err)
		}
	}
	return nil
}

// Kit is one test's database, migrated, with the framework's store and
// unit of work on it. Create it with New; everything is closed when the
// test ends.
type Kit struct {
	cfg   Config
	db    *sqlx.DB
	store driver.Store
	uow   *driver.UnitOfWork
}

// New returns a kit on a fresh database: a SQLite file in t.TempDir(), or
// a schema of the test's own when cfg.PostgresURL is set. It applies the
// framework's migrations and then cfg.Migrations, and registers the
// closing of everything with t.Cleanup. It fails the test when any of it
// fails.
func New(t testing.TB, cfg Config) *Kit {
	t.Helper()
	k, err := newKit(t, cfg)
	if err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}
	return k
}

func newKit(t testing.TB, cfg Config) (*Kit, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), setupTimeout)
	defer cancel()

	k := &Kit{cfg: cfg}
	var err error
	if cfg.PostgresURL != "" {
		k.db, err = openPostgres(ctx, t, cfg.PostgresURL)
	} else {
		k.db, err = sqlite.Open(ctx, filepath.Join(t.TempDir(), SQLiteFile), sqlite.OpenConfig{})
	}
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = k.db.Close() })

	if err := migrate.Up(ctx, k.db, migrate.Config{TablePrefix: cfg.TablePrefix, Extra: cfg.Migrations}); err != nil {
		return nil, err
	}
	if cfg.PostgresURL != "" {
		k.store, err = postgres.NewStore(k.db, postgres.StoreConfig{TablePrefix: cfg.TablePrefix})
	} else {
		k.store, err = sqlite.NewStore(k.db, sqlite.StoreConfig{TablePrefix: cfg.TablePrefix})
	}
	if err != nil {
		return nil, err
	}
	k.uow, err = driver.NewUnitOfWork(driver.UnitOfWorkConfig{
		DB: k.db, Store: k.store, BatchSize: cfg.BatchSize, Batches: cfg.Batches, Linger: cfg.BatchLinger,
		Overlap: cfg.Overlap,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// openPostgres creates a schema of the test's own on the server at base,
// drops it at cleanup, and opens a pool whose connections use it.
func openPostgres(ctx context.Context, t testing.TB, base string) (*sqlx.DB, error) {
	schema, err := pgschema.Create(ctx, base, "testkit_")
	if err != nil {
		return nil, err
	}
	// Registered before the pool's Close, so it runs after it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if err := schema.Drop(ctx); err != nil {
			t.Errorf("testkit: drop schema %s: %v", schema.Name, err)
		}
	})
	return postgres.Open(ctx, schema.URL, postgres.OpenConfig{})
}

// DB returns the kit's database, for the handler's constructors and the
// test's assertions. On PostgreSQL its connections use the test's schema;
// write queries with "?" and DB().Rebind to run them on both databases.
func (k *Kit) DB() *sqlx.DB { return k.db }

// Store returns the framework's store on the kit's database: processed
// marks, delivery counts, dead letters and checkpoints.
func (k *Kit) Store() driver.Store { return k.store }

// Config returns the kit's configuration, defaults filled in.
func (k *Kit) Config() Config { return k.cfg }

// DeadLetters returns every dead letter of every consumer, whatever its
// status, oldest first.
func (k *Kit) DeadLetters(ctx context.Context, t testing.TB) []driver.DeadLetter {
	t.Helper()
	return k.deadLetters(ctx, t, driver.DeadLetterFilter{})
}

func (k *Kit) deadLetters(ctx context.Context, t testing.TB, f driver.DeadLetterFilter) []driver.DeadLetter {
	t.Helper()
	const page = 500
	f.Limit = page
	var all []driver.DeadLetter
	for {
		dls, err := k.store.DeadLetters(ctx, f)
		if err != nil {
			t.Fatalf("testkit: list dead letters: %v", err)
			return nil
		}
		all = append(all, dls...)
		if len(dls) < page {
			return all
		}
		f.AfterID = dls[len(dls)-1].ID
	}
}

// DefaultSource is the source Envelope gives an event without one.
const DefaultSource = "testkit"

// Envelope builds an event of def from data and attrs (see
// framework.Definition.New) and encodes its data, failing the test when
// it does not validate. An empty Source becomes DefaultSource; an empty ID
// a new UUIDv7.
func Envelope[T any](t testing.TB, def framework.Definition[T], data T, attrs framework.Attributes) framework.Envelope {
	t.Helper()
	if attrs.Source == "" {
		attrs.Source = DefaultSource
	}
	env, err := def.Envelope(data, attrs)
	if err != nil {
		t.Fatalf("testkit: build %s: %v", def, err)
		return framework.Envelope{}
	}
	return env
}
