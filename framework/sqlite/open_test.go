package sqlite_test

import (
	"context"
	"database/sql"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestOpenPageCache: every connection of an opened file keeps
// PageCacheKiB of pages (cache_size in KiB is negative), the default when
// unset, and a cache_size pragma in the DSN wins over both.
func TestOpenPageCache(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		query string
		cfg   sqlite.OpenConfig
		want  int
	}{
		{name: "Default", want: -sqlite.DefaultPageCacheKiB},
		{name: "Configured", cfg: sqlite.OpenConfig{PageCacheKiB: 3000}, want: -3000},
		{name: "DSN", query: "?_pragma=cache_size(-4000)", cfg: sqlite.OpenConfig{PageCacheKiB: 3000}, want: -4000}, // as docs/transports.md shows
		{name: "DSNPages", query: "?_pragma=CACHE_SIZE(100)", want: 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, err := sqlite.Open(ctx, "file:"+testenv.SQLitePath(t)+c.query, c.cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			// Two connections at once: each has the pragma, not only the first.
			conns := make([]int, 2)
			a, err := db.Conn(ctx)
			require.NoError(t, err)
			defer a.Close()
			b, err := db.Conn(ctx)
			require.NoError(t, err)
			defer b.Close()
			require.NoError(t, a.QueryRowContext(ctx, "PRAGMA cache_size").Scan(&conns[0]))
			require.NoError(t, b.QueryRowContext(ctx, "PRAGMA cache_size").Scan(&conns[1]))
			require.Equal(t, []int{c.want, c.want}, conns)
		})
	}
}

func TestOpenValidatesPageCache(t *testing.T) {
	t.Parallel()
	_, err := sqlite.Open(context.Background(), testenv.SQLitePath(t), sqlite.OpenConfig{PageCacheKiB: -1})
	require.ErrorContains(t, err, "PageCacheKiB")
}

// TestOpenConcurrently: processes that open one new file at the same time
// all open it. The first connection to switch the file to write-ahead
// logging takes its exclusive lock, and SQLite answers a connection that
// asks for the journal mode meanwhile with SQLITE_BUSY at once, busy
// timeout or not: a service and an operator's command started together
// on a new file failed to open it ("database is locked"), once in a few
// hundred opens here, before Connect tried again.
func TestOpenConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const rounds, openers = 200, 8
	for range rounds {
		path := testenv.SQLitePath(t)
		errs := make(chan error, openers)
		for range openers {
			go func() {
				db, err := sqlite.Open(ctx, path, sqlite.OpenConfig{})
				if err == nil {
					err = db.Close()
				}
				errs <- err
			}()
		}
		for range openers {
			require.NoError(t, <-errs)
		}
	}
}

// TestOpenMustExist: with MustExist, a missing file is refused, and
// neither it nor its folder is created; an existing file opens.
func TestOpenMustExist(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "typo")
	path := filepath.Join(dir, "effectively.db")
	_, err := sqlite.Open(ctx, "file:"+path, sqlite.OpenConfig{MustExist: true})
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, "no database file at "+path)
	_, statErr := os.Stat(dir)
	require.ErrorIs(t, statErr, fs.ErrNotExist, "the folder is not created")

	db, err := sqlite.Open(ctx, path, sqlite.OpenConfig{})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	db, err = sqlite.Open(ctx, "file:"+path, sqlite.OpenConfig{MustExist: true})
	require.NoError(t, err, "the file exists now")
	require.NoError(t, db.Close())

	db, err = sqlite.Open(ctx, ":memory:", sqlite.OpenConfig{MustExist: true})
	require.NoError(t, err, "an in-memory database has no file")
	require.NoError(t, db.Close())

	odd := filepath.Join(dir, "x\x1b[31m.db")
	_, err = sqlite.Open(ctx, "file:"+odd, sqlite.OpenConfig{MustExist: true})
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, `no database file at `+dir+`/x\x1b[31m.db`, "an escape sequence is shown escaped")
}

// TestOpenMustExistChangesNothing: with MustExist, a file that is not a
// SQLite database (an empty one included) is refused and left as it is,
// and a database that is not in WAL mode (another program's) opens
// without being switched to it: a program that looks into the wrong
// file changes nothing in it.
func TestOpenMustExistChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	for name, content := range map[string][]byte{
		"empty":  {},
		"text":   []byte("customers: alice, bob\n"),
		"short":  []byte("SQLite format"),
		"header": []byte("SQLite format 2\x00 and more than twenty bytes"),
	} {
		path := filepath.Join(dir, name+".db")
		require.NoError(t, os.WriteFile(path, content, 0o600))
		_, err := sqlite.Open(ctx, "file:"+path, sqlite.OpenConfig{MustExist: true})
		require.Error(t, err, name)
		require.ErrorContains(t, err, path)
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, content, got, "%s: the file is left as it was", name)
	}

	// Another program's database, in the rollback journal's mode.
	path := filepath.Join(dir, "other.db")
	other, err := sql.Open(sqlite.DriverName, path)
	require.NoError(t, err)
	_, err = other.Exec(`CREATE TABLE customers (id INTEGER)`)
	require.NoError(t, err)
	require.NoError(t, other.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	db, err := sqlite.Open(ctx, "file:"+path, sqlite.OpenConfig{MustExist: true})
	require.NoError(t, err)
	var mode string
	require.NoError(t, db.Get(&mode, `PRAGMA journal_mode`))
	require.Equal(t, "delete", mode, "not switched to WAL")
	require.NoError(t, db.Close())
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, before, after, "the file is left as it was")
}

// TestInMemory: the spellings of a database with no file, which Open
// gives no file's pragmas and a service refuses, and files that only look
// like one.
func TestInMemory(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]bool{
		":memory:": true, "file::memory:": true, "file::memory:?cache=shared": true, "file:%3Amemory%3A": true,
		"file:a.db?mode=memory": true, "file:a.db?MODE=Memory": false, "file:a.db?mode=MEMORY": true,
		"file:a.db?vfs=memdb": true, "file:": true, "file:?cache=shared": true,
		"a.db": false, "file:a.db": false, "file:a.db?mode=ro": false, "./:memory:": false, "file:/tmp/memory.db": false,
	} {
		require.Equal(t, want, sqlite.InMemory(dsn), dsn)
	}
}
