package sqlite_test

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestOpenFileGone: once the database file is deleted, a ping, a new
// connection, and a transaction or a write on an open one fail, naming
// the file, and no empty file appears at its path; a file put in its
// place is refused too. Before, the open connections went on committing
// into the deleted file and the ping said nothing.
func TestOpenFileGone(t *testing.T) {
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
			path := testenv.SQLitePath(t)
			db, err := sqlite.Open(ctx, path, sqlite.OpenConfig{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			_, err = db.ExecContext(ctx, "CREATE TABLE effects (id INTEGER PRIMARY KEY)")
			require.NoError(t, err)
			open, err := db.Conn(ctx) // a connection open before the file goes
			require.NoError(t, err)
			defer open.Close()

			if c.replace {
				// Another file renamed over the path, as a restore does: the
				// path is never missing.
				other, err := sqlite.Open(ctx, path+".restored", sqlite.OpenConfig{})
				require.NoError(t, err)
				require.NoError(t, other.Close())
				require.NoError(t, os.Rename(path+".restored", path))
			} else {
				require.NoError(t, os.Remove(path))
			}
			for _, suffix := range []string{"-wal", "-shm"} {
				require.NoError(t, os.Remove(path+suffix))
			}

			// A ping looks at the file at once; the refusal holds for good.
			require.ErrorContains(t, db.PingContext(ctx), c.want)
			require.ErrorContains(t, open.PingContext(ctx), c.want)
			_, err = open.BeginTx(ctx, nil)
			require.ErrorContains(t, err, c.want)
			_, err = open.ExecContext(ctx, "INSERT INTO effects DEFAULT VALUES")
			require.ErrorContains(t, err, c.want)
			_, err = open.QueryContext(ctx, "INSERT INTO effects DEFAULT VALUES RETURNING id")
			require.ErrorContains(t, err, c.want)
			_, err = db.ExecContext(ctx, "INSERT INTO effects DEFAULT VALUES")
			require.ErrorContains(t, err, c.want)
			if !c.replace {
				_, err = os.Stat(path)
				require.ErrorIs(t, err, os.ErrNotExist, "a new connection created an empty file")
			}
		})
	}
}
