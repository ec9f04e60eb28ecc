package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/effectively-once/effectively/internal/printable"
)

// DriverName is the database/sql driver name of modernc.org/sqlite.
const DriverName = "sqlite"

// DefaultBusyTimeout is how long a connection waits for the file's write
// lock before it gives up with SQLITE_BUSY. It must exceed the longest
// attempt a consumer makes, since an attempt holds the write lock.
const DefaultBusyTimeout = time.Minute

// DefaultMaxOpenConns bounds the pool of an opened file.
const DefaultMaxOpenConns = 8

// DefaultPageCacheKiB is how much of the file's pages each connection
// keeps in memory, in KiB (PRAGMA cache_size; SQLite's own default is
// 2,000 KiB). Under WAL a connection empties its cache whenever another
// one committed since its last transaction, which in a consumer is nearly
// every time, so a larger cache is rarely read again; but the memory a
// cache once filled stays with the process. Over a million events the
// example consumer grew by 2.9 and 5.1 MiB in two runs at SQLite's
// default, by 1.8 to 3.5 MiB in three at this one, at the same speed.
const DefaultPageCacheKiB = 512

// OpenConfig configures Open.
type OpenConfig struct {
	// BusyTimeout is how long a writer waits for the write lock.
	// Defaults to DefaultBusyTimeout.
	BusyTimeout time.Duration
	// MaxOpenConns bounds the connection pool. Defaults to DefaultMaxOpenConns.
	MaxOpenConns int
	// PageCacheKiB is how much of the file's pages each connection keeps
	// in memory, in KiB (PRAGMA cache_size). A cache_size pragma in the
	// DSN's query takes precedence. Defaults to DefaultPageCacheKiB.
	PageCacheKiB int
	// StatementCacheSize is how many prepared statements each connection
	// keeps, by query text, the least recently used dropped first: a
	// statement run again is only bound and stepped, not parsed and
	// planned again. Negative keeps none. Defaults to
	// DefaultStatementCacheSize.
	StatementCacheSize int
	// CheckpointInterval is how often, at most, the file's write-ahead log
	// is checkpointed while the process writes, on a connection of its own
	// and outside the write gate (see checkpointer); negative leaves the
	// checkpoints to SQLite, which makes them in the committing writer
	// once the log holds 1,000 pages. Defaults to
	// DefaultCheckpointInterval.
	CheckpointInterval time.Duration
	// MustExist refuses a file that does not exist, with an error that
	// wraps fs.ErrNotExist, instead of creating it (and its folder): for a
	// program that only looks into an existing database, where a
	// mistyped path would otherwise leave an empty file behind. It also
	// refuses a file that is not a SQLite database (an empty one
	// included), and leaves the journal mode of one that is not in WAL
	// mode as it is (see fileJournal), so that looking into the wrong
	// file changes nothing in it.
	MustExist bool
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c OpenConfig) WithDefaults() OpenConfig {
	c.BusyTimeout = cmp.Or(c.BusyTimeout, DefaultBusyTimeout)
	c.MaxOpenConns = cmp.Or(c.MaxOpenConns, DefaultMaxOpenConns)
	c.PageCacheKiB = cmp.Or(c.PageCacheKiB, DefaultPageCacheKiB)
	c.StatementCacheSize = cmp.Or(c.StatementCacheSize, DefaultStatementCacheSize)
	c.CheckpointInterval = cmp.Or(c.CheckpointInterval, DefaultCheckpointInterval)
	return c
}

// Validate reports the first invalid field of c.
func (c OpenConfig) Validate() error {
	if c.BusyTimeout < 0 {
		return fmt.Errorf("sqlite: BusyTimeout must not be negative, got %s", c.BusyTimeout)
	}
	if c.MaxOpenConns < 1 {
		return fmt.Errorf("sqlite: MaxOpenConns must be at least 1, got %d", c.MaxOpenConns)
	}
	if c.PageCacheKiB < 1 {
		return fmt.Errorf("sqlite: PageCacheKiB must be at least 1, got %d", c.PageCacheKiB)
	}
	return nil
}

// Open opens the SQLite database at dsn the way the framework needs it:
// write-ahead logging, a busy timeout, foreign keys on, and transactions
// that take the write lock when they begin (BEGIN IMMEDIATE), so two
// writers queue on the busy timeout instead of failing on a lock upgrade.
//
// Write transactions of this process queue in Go, first come first
// served, for the write lock of the file (see writeGate), instead of in
// SQLite's busy handler; writers of other processes still meet in the busy
// handler. Each connection keeps the statements it ran prepared, by query
// text (see OpenConfig.StatementCacheSize). The write-ahead log is
// checkpointed on a connection of its own, so that no writer waits for a
// checkpoint's syncs (see OpenConfig.CheckpointInterval).
//
// dsn is a file path or a "file:" URI; query parameters of the URI are
// kept. The file and its folder are created when they are missing, unless
// OpenConfig.MustExist; only the first connection creates the file, the
// ones after open it only while it is there, so that a file deleted while
// open is not created again, empty. Open pings the database before it
// returns.
func Open(ctx context.Context, dsn string, cfg OpenConfig) (*sqlx.DB, error) {
	return open(ctx, dsn, cfg, restartFrames)
}

// open is Open with the length of the log past which a checkpoint holds
// the write gate (see checkpointer).
func open(ctx context.Context, dsn string, cfg OpenConfig, restart int64) (*sqlx.DB, error) {
	db, _, err := openGated(ctx, dsn, cfg, restart)
	return db, err
}

// openGated is open, which also returns the write gate of the
// database's connections (and through it its checkpointer).
func openGated(ctx context.Context, dsn string, cfg OpenConfig, restart int64) (*sqlx.DB, *writeGate, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	full, existing, path, err := buildDSN(dsn, cfg, true)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case path != "" && cfg.MustExist:
		wal, err := fileJournal(path)
		if err != nil {
			return nil, nil, err
		}
		if !wal {
			if full, existing, _, err = buildDSN(dsn, cfg, false); err != nil {
				return nil, nil, err
			}
		}
	case path != "":
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, nil, fmt.Errorf("sqlite: create folder of %s: %w", path, err)
		}
	}
	registered, err := sql.Open(DriverName, "")
	if err != nil {
		return nil, nil, fmt.Errorf("sqlite: open %s: %w", dsn, err)
	}
	drv := registered.Driver()
	_ = registered.Close() // it never connected
	gate := newWriteGate(cfg.BusyTimeout)
	connector := &gatedConnector{dsn: full, existing: existing, driver: drv, gate: gate, stmts: max(cfg.StatementCacheSize, 0)}
	if cfg.MustExist {
		connector.dsn = existing // not even the first connection creates it
	}
	if path != "" {
		identity := &fileIdentity{path: path}
		connector.identity = identity
		if cfg.CheckpointInterval > 0 {
			gate.checkpoints = newCheckpointer(func() (driver.Conn, error) {
				if err := identity.checkNow(); err != nil {
					return nil, err // no connection to a file gone or replaced
				}
				return connector.open(context.Background())
			}, gate, cfg.CheckpointInterval, restart)
		}
	}
	db := sqlx.NewDb(sql.OpenDB(connector), DriverName)
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxOpenConns)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("sqlite: open %s: %w", dsn, err)
	}
	return db, gate, nil
}

// InMemory reports whether the database dsn (a path or "file:" URI, as
// Open takes) names no file: ":memory:" (or "file::memory:"), a file: URI
// with mode=memory or vfs=memdb, or an empty path ("file:",
// "file:?cache=shared"), which SQLite makes a private temporary database
// of. The path is %-decoded, as SQLite decodes a file: URI's. Open puts
// no file's pragmas on such a database; a service refuses it (each of its
// pooled connections would have one of its own).
func InMemory(dsn string) bool {
	path, rawQuery, _ := strings.Cut(strings.TrimPrefix(dsn, "file:"), "?")
	if strings.HasPrefix(dsn, "file:") {
		if decoded, err := url.PathUnescape(path); err == nil {
			path = decoded
		}
	}
	if path == "" || path == ":memory:" {
		return true
	}
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		return false // Open refuses it
	}
	return strings.EqualFold(query.Get("mode"), "memory") || strings.EqualFold(query.Get("vfs"), "memdb")
}

// buildDSN turns a path or file: URI into the driver's DSN with the
// framework's pragmas, full, and returns the file's path (empty for
// in-memory databases). existing is full for the connections after the
// first: they open the file only if it is there (mode=rw, or the URI's
// mode=ro), instead of creating an empty one where it was deleted. For an
// in-memory database existing is full.
func buildDSN(dsn string, cfg OpenConfig, wal bool) (full, existing, path string, err error) {
	if dsn == "" {
		return "", "", "", fmt.Errorf("sqlite: empty database path")
	}
	rest := strings.TrimPrefix(dsn, "file:")
	var query url.Values
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		query, err = url.ParseQuery(rest[i+1:])
		if err != nil {
			return "", "", "", fmt.Errorf("sqlite: parse options of %q: %w", dsn, err)
		}
		rest = rest[:i]
	} else {
		query = url.Values{}
	}
	memory := InMemory(dsn)
	if !memory {
		path = rest
	}
	pragmas := []string{
		fmt.Sprintf("busy_timeout(%d)", cfg.BusyTimeout.Milliseconds()),
		"foreign_keys(1)",
		"synchronous(NORMAL)",
	}
	if !memory && wal {
		// After busy_timeout, so that it waits where SQLite lets it.
		pragmas = slices.Insert(pragmas, 1, "journal_mode(WAL)")
		if cfg.CheckpointInterval > 0 {
			pragmas = append(pragmas, "wal_autocheckpoint(0)") // see checkpointer
		}
	}
	if !setsPragma(query, "cache_size") {
		pragmas = append(pragmas, fmt.Sprintf("cache_size(-%d)", cfg.PageCacheKiB)) // negative: KiB, not pages
	}
	for _, p := range pragmas {
		query.Add("_pragma", p)
	}
	if query.Get("_txlock") == "" {
		query.Set("_txlock", "immediate")
	}
	full = "file:" + rest + "?" + query.Encode()
	if memory || query.Get("mode") == "ro" {
		return full, full, path, nil
	}
	query.Set("mode", "rw") // SQLite's URI parameter: full is a file: URI
	return full, "file:" + rest + "?" + query.Encode(), path, nil
}

// sqliteHeader is how every SQLite database file begins.
const sqliteHeader = "SQLite format 3\x00"

// fileJournal reads the header of the database file at path, which must
// exist, and reports whether the file is in WAL mode (its format's write
// and read versions, bytes 18 and 19, are 2). A missing file is an error
// that wraps fs.ErrNotExist; an empty file, or one that is not a SQLite
// database, is an error too: SQLite would write its header into the
// first, and refuse the second only after connecting.
func fileJournal(path string) (wal bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("sqlite: no database file at %s: %w", printable.String(path), fs.ErrNotExist)
	}
	if err != nil {
		return false, fmt.Errorf("sqlite: open %s: %w", printable.String(path), err)
	}
	defer f.Close()
	var head [20]byte
	n, err := io.ReadFull(f, head[:])
	switch {
	case n == 0 && (err == nil || errors.Is(err, io.EOF)):
		return false, fmt.Errorf("sqlite: %s is an empty file, not a database", printable.String(path))
	case errors.Is(err, io.ErrUnexpectedEOF) || err == nil && string(head[:len(sqliteHeader)]) != sqliteHeader:
		return false, fmt.Errorf("sqlite: %s is not a SQLite database", printable.String(path))
	case err != nil:
		return false, fmt.Errorf("sqlite: read %s: %w", printable.String(path), err)
	}
	return head[18] == 2 && head[19] == 2, nil
}

// setsPragma reports whether the DSN's query sets the pragma name itself,
// in any case ("_pragma=CACHE_SIZE(100)").
func setsPragma(query url.Values, name string) bool {
	return slices.ContainsFunc(query["_pragma"], func(p string) bool {
		return strings.HasPrefix(strings.ToLower(strings.TrimSpace(p)), name)
	})
}
