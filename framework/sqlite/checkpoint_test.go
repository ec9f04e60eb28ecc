package sqlite

import (
	"context"
	"database/sql/driver"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCheckpoints checks that the write-ahead log of a file opened by
// Open is checkpointed in the background, not by its writers: with the
// checkpoints held off, the log keeps every page written; with them on,
// it is copied back and started again while the writers go on (each
// commit right after the one before), as SQLite's own checkpoints in the
// writer would.
func TestCheckpoints(t *testing.T) {
	t.Parallel()
	const (
		commits = 120 // each writes five leaf pages and their parent
		pages   = 5 * commits
		restart = 100 // frames, restartFrames in Open
		page    = 4096
	)
	// walAfterWrites opens a file with interval, writes pages in commits
	// transactions and returns the log's size and the connections'
	// wal_autocheckpoint.
	walAfterWrites := func(t *testing.T, interval time.Duration) (walBytes int64, autocheckpoint int) {
		t.Helper()
		ctx := context.Background()
		path := filepath.Join(t.TempDir(), "wal.db")
		db, gate, err := openGated(ctx, path, OpenConfig{CheckpointInterval: interval}, restart)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		require.NoError(t, db.GetContext(ctx, &autocheckpoint, `PRAGMA wal_autocheckpoint`))
		_, err = db.ExecContext(ctx, `CREATE TABLE pages (b BLOB NOT NULL)`)
		require.NoError(t, err)
		background := interval > 0 && interval < time.Second
		if interval >= time.Second {
			// The first write's checkpoint comes at once, the next not
			// before the interval: a busy machine may hold the first
			// back into the writes, which it would copy back, and the
			// log would start again under them.
			require.Eventually(t, func() bool { return gate.checkpoints.rounds.Load() > 0 },
				10*time.Second, time.Millisecond, "the first write's checkpoint")
		}
		for i := range commits {
			// A busy machine may hold the checkpointer back while the
			// writers go on: let it take a turn every ten commits, as
			// the interval would on an idle one. The rounds are read
			// before the commit, whose write asks for the next one: a
			// round may end before this goroutine looks again.
			turn := background && i%10 == 9
			var before int64
			if turn {
				before = gate.checkpoints.rounds.Load()
			}
			_, err := db.ExecContext(ctx, `INSERT INTO pages (b) SELECT randomblob(4000) FROM
				(SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5)`)
			require.NoError(t, err)
			if turn {
				require.Eventually(t, func() bool { return gate.checkpoints.rounds.Load() > before },
					10*time.Second, time.Millisecond, "a checkpoint after commit %d", i+1)
			}
		}
		if background {
			time.Sleep(20 * interval) // the last checkpoint, due by now
		}
		fi, err := os.Stat(path + "-wal")
		require.NoError(t, err)
		return fi.Size(), autocheckpoint
	}

	t.Run("HeldOff", func(t *testing.T) {
		t.Parallel()
		// The first write's checkpoint comes at once, the next in an
		// hour: nothing else checkpoints, not the writers.
		size, auto := walAfterWrites(t, time.Hour)
		require.Zero(t, auto, "the writers' own checkpoints are off")
		require.Greater(t, size, int64(pages*page), "the log holds every page written")
	})
	t.Run("InTheBackground", func(t *testing.T) {
		t.Parallel()
		size, auto := walAfterWrites(t, 5*time.Millisecond)
		require.Zero(t, auto)
		t.Logf("log: %d bytes", size)
		require.Less(t, size, int64(pages*page/2), "the log was checkpointed and started again")
	})
	t.Run("BySQLite", func(t *testing.T) {
		t.Parallel()
		// A negative interval leaves the checkpoints to SQLite, in the
		// writer, every 1,000 pages (more than written here).
		_, auto := walAfterWrites(t, -time.Millisecond)
		require.Equal(t, 1000, auto)
	})
}

// TestCheckpointsRestWithoutWrites: a reader that keeps the log from
// starting again leaves it long; a checkpoint holding the gate for it
// writes nothing, so once the writes stop the checkpoints stop too,
// instead of taking the gate every interval of an idle process.
func TestCheckpointsRestWithoutWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "pinned.db")
	db, err := Open(ctx, path, OpenConfig{CheckpointInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	_, err = db.ExecContext(ctx, `CREATE TABLE pages (b BLOB NOT NULL)`)
	require.NoError(t, err)

	// The reader's snapshot, taken before the writes, pins their frames.
	reader, err := db.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reader.Close() })
	_, err = reader.ExecContext(ctx, `BEGIN DEFERRED`)
	require.NoError(t, err)
	var n int
	require.NoError(t, reader.QueryRowContext(ctx, `SELECT count(*) FROM pages`).Scan(&n))
	t.Cleanup(func() { _, _ = reader.ExecContext(ctx, `ROLLBACK`) })
	for range 40 {
		_, err := db.ExecContext(ctx, `INSERT INTO pages (b) SELECT randomblob(4000) FROM
			(SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5)`)
		require.NoError(t, err)
	}

	full, _, _, err := buildDSN(path, OpenConfig{CheckpointInterval: -1}.WithDefaults(), true)
	require.NoError(t, err)
	drv := db.Driver()
	gate := newWriteGate(time.Second)
	c := newCheckpointer(func() (driver.Conn, error) { return drv.Open(full) }, gate, 5*time.Millisecond, 100)
	gate.checkpoints = c // as Open wires them
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	c.written()
	require.Eventually(t, func() bool { return c.rounds.Load() > 0 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // twenty intervals
	before := c.rounds.Load()
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, before, c.rounds.Load(), "checkpoints went on with nothing written")
}
