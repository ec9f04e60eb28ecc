package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"testing/fstest"
	"text/template"

	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations
var migrations embed.FS

// Migrations returns the framework's goose SQL migrations for d with every
// table name prefixed by prefix, as an in-memory file system whose root
// holds the numbered files.
func Migrations(d Dialect, prefix string) (fs.FS, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	if err := ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	dir := path.Join("migrations", string(d))
	entries, err := fs.ReadDir(migrations, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations of %s: %w", d, err)
	}
	out := fstest.MapFS{}
	for _, e := range entries {
		name := path.Join(dir, e.Name())
		text, err := fs.ReadFile(migrations, name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		tmpl, err := template.New(e.Name()).Option("missingkey=error").Parse(string(text))
		if err != nil {
			return nil, fmt.Errorf("parse migration %s: %w", name, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, struct{ P string }{P: prefix}); err != nil {
			return nil, fmt.Errorf("render migration %s: %w", name, err)
		}
		out[e.Name()] = &fstest.MapFile{Data: buf.Bytes(), Mode: 0o444}
	}
	return out, nil
}

// VersionTable is the name, before the prefix, of the table where goose
// records the framework's applied migrations. It is not plain
// "schema_migrations", which other migration tools use.
const VersionTable = "effectively_schema_migrations"

// Locker returns the lock that serialises migrations of d across
// processes, or nil when d needs none: on PostgreSQL a session advisory
// lock keyed by the current schema and versionTable, so that two processes
// migrating the same tables wait for each other. SQLite needs none: each
// migration runs in a transaction that takes the file's write lock when it
// begins, and the migrations are idempotent (IF NOT EXISTS).
func Locker(d Dialect, versionTable string) lock.SessionLocker {
	if d != Postgres {
		return nil
	}
	return advisoryLocker{key: versionTable}
}

// advisoryLocker holds pg_advisory_lock on the migrating connection. Unlike
// goose's own locker, which polls pg_try_advisory_lock every few seconds,
// it waits in the server and stops when ctx ends.
type advisoryLocker struct{ key string }

const (
	advisoryLock   = `SELECT pg_advisory_lock(hashtextextended(current_schema() || '.' || $1, 0))`
	advisoryUnlock = `SELECT pg_advisory_unlock(hashtextextended(current_schema() || '.' || $1, 0))`
)

func (l advisoryLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, advisoryLock, l.key); err != nil {
		return fmt.Errorf("lock migrations: %w", err)
	}
	return nil
}

func (l advisoryLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var unlocked bool
	if err := conn.QueryRowContext(ctx, advisoryUnlock, l.key).Scan(&unlocked); err != nil {
		return fmt.Errorf("unlock migrations: %w", err)
	}
	if !unlocked {
		return fmt.Errorf("unlock migrations: the lock was not held")
	}
	return nil
}

// TableExists reports whether the table name exists in db: on PostgreSQL
// in the current schema (the first of the search path that exists), on
// SQLite in the main database. It changes nothing.
func TableExists(ctx context.Context, db *sql.DB, d Dialect, name string) (bool, error) {
	q := `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)`
	if d == Postgres {
		q = `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)`
	}
	var exists bool
	if err := db.QueryRowContext(ctx, q, name).Scan(&exists); err != nil {
		return false, fmt.Errorf("look for table %s: %w", name, err)
	}
	return exists, nil
}
