package sqlite

import (
	"context"
	"database/sql/driver"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sqlitedriver "modernc.org/sqlite"
)

// newFileConnector returns a connector of the file at path as Open makes
// it, without the pool around it, and its first connection, which created
// the file.
func newFileConnector(t *testing.T, path string) (*gatedConnector, driver.Conn) {
	t.Helper()
	full, existing, file, err := buildDSN(path, OpenConfig{}.WithDefaults(), true)
	require.NoError(t, err)
	c := &gatedConnector{
		dsn: full, existing: existing, driver: &sqlitedriver.Driver{},
		gate: newWriteGate(time.Second), identity: &fileIdentity{path: file},
	}
	first, err := c.Connect(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Close() })
	return c, first
}

// TestOpenAfterFileGone: a connection opened after the first, by the pool
// or the checkpointer, opens the file only while it is there. The look
// before an open and the open are two steps; here the file goes, or
// another is put in its place, between them, as the file went in
// TestOpenFileGone about once in 36 runs while the checkpointer opened its
// connection. The open fails naming what became of the file, and leaves
// no empty file at the path, which the next look took for another file
// put there ("was replaced" where it was gone).
func TestOpenAfterFileGone(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		replace bool
		want    string
	}{
		{name: "Deleted", want: "is gone since it was opened"},
		{name: "Replaced", replace: true, want: "was replaced since it was opened"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "gone.db")
			connector, _ := newFileConnector(t, path)

			require.NoError(t, connector.identity.checkNow(), "the look before the open")
			if c.replace {
				newFileConnector(t, path+".restored")
				require.NoError(t, os.Rename(path+".restored", path))
			} else {
				require.NoError(t, os.Remove(path))
			}
			conn, err := connector.open(ctx)
			if conn != nil {
				_ = conn.Close()
			}
			require.ErrorContains(t, err, c.want)
			require.Nil(t, conn, "a connection to a file gone or replaced")
			if !c.replace {
				_, err = os.Stat(path)
				require.ErrorIs(t, err, fs.ErrNotExist, "the open created an empty file")
			}
			_, err = connector.Connect(ctx)
			require.ErrorContains(t, err, c.want, "the refusal holds for good")
		})
	}
}

// TestBuildDSNExisting: the connections after the first open the file
// read-write without creating it (mode=rw in place of a URI's rwc), or
// read-only when the URI says so; an in-memory database's are opened as
// its first.
func TestBuildDSNExisting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dsn, mode string // mode: of existing; "" when it is full
	}{
		{dsn: "/tmp/x.db", mode: "rw"},
		{dsn: "file:/tmp/x.db?mode=rwc", mode: "rw"},
		{dsn: "file:/tmp/x.db?mode=rw", mode: "rw"},
		{dsn: "file:/tmp/x.db?mode=ro"},
		{dsn: ":memory:"},
		{dsn: "file:mem?mode=memory&cache=shared"},
	} {
		full, existing, _, err := buildDSN(c.dsn, OpenConfig{}.WithDefaults(), true)
		require.NoError(t, err, c.dsn)
		if c.mode == "" {
			require.Equal(t, full, existing, c.dsn)
			continue
		}
		require.Contains(t, existing, "mode="+c.mode, c.dsn)
		require.NotContains(t, existing, "mode=rwc", c.dsn)
	}
}
