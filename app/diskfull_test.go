package app_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestSQLiteDiskFull: the SQLite file on a small filesystem that fills
// while messages wait to be handled. Their attempts fail for lack of
// space and pause, uncharged: the consumer takes no further message,
// /readyz says "database full", nothing is acknowledged without its
// effect and nothing is dead-lettered. Once the filesystem is grown, the
// attempts run again by themselves and every effect is there once.
func TestSQLiteDiskFull(t *testing.T) {
	t.Parallel()
	disk := testserver.MountDisk(t, 8<<20)
	cfg := testConfig(t)
	cfg.DatabaseURL = filepath.Join(disk.Dir, "app.db")
	cfg.TransportURL = cfg.DatabaseURL
	testDiskFull(t, cfg, disk, 8<<20, nil)
}

// TestPostgresDiskFull is TestSQLiteDiskFull with PostgreSQL's data
// directory on the small filesystem, on RabbitMQ and on the postgres
// transport (its messages in the same database).
func TestPostgresDiskFull(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config func(t *testing.T) app.Config
		// walFull makes PostgreSQL need a WAL segment on the full disk:
		// it stops with a PANIC, and its recovery cannot finish until
		// there is room and an operator starts it again.
		walFull bool
	}{
		{"AMQP", amqpConfig, false},
		{"Postgres", postgresConfig, false},
		{"AMQPWALFull", amqpConfig, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const size = 128 << 20
			pg, disk := testserver.StartPostgresOnDisk(t, size)
			cfg := tc.config(t)
			cfg.DatabaseURL = pg.URL
			if cfg.Transport == app.TransportPostgres {
				cfg.TransportURL = pg.URL
			}
			if !tc.walFull {
				pg = nil
			}
			testDiskFull(t, cfg, disk, size, pg)
		})
	}
}

// testDiskFull runs the service of cfg, whose database is on disk (of
// size bytes), and fills the disk while messages wait to be handled.
// With walFull, the PostgreSQL server of cfg, the server then needs a new
// WAL segment: it stops, and is started again once the disk has grown.
func testDiskFull(t *testing.T, cfg app.Config, disk *testserver.Disk, size int64, walFull *testserver.Postgres) {
	t.Helper()
	gate := make(chan struct{})
	hold := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			<-gate
			return next(msg)
		}
	}
	b, _ := setupIsolated(t, cfg, fx.Supply(app.Middleware{Outer: []message.HandlerMiddleware{hold}}))
	ready := readyzOf(t, b)

	const events = 40
	name := strings.Repeat("w", 16<<10) // a page or more each
	for i := range events {
		b.publish(t, fmt.Sprintf("w-%d", i), name)
	}
	stalled := b.count(t, `SELECT count(*) FROM widgets`)
	if cfg.Transport == app.TransportSQLite {
		// An empty write-ahead log, so that the next commit needs room:
		// SQLite reuses the log's space once it is checkpointed.
		waitFor(t, "the write-ahead log truncated", func() bool {
			var busy, pages, done int
			require.NoError(t, b.db.QueryRow(`PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &pages, &done))
			return busy == 0
		})
	}
	disk.Fill(t)
	filled := time.Now()
	want := "database full"
	if walFull != nil {
		_, err := b.db.Exec(`SELECT pg_switch_wal()`) // the next record needs a new segment
		require.NoError(t, err)
		_, _ = b.db.Exec(`CREATE TABLE needs_wal (b text)`)
		want = "database unavailable"
	}
	close(gate) // the messages held so far try now

	var reason string
	waitFor(t, "/readyz to say "+want, func() bool { // "database full" first, with walFull
		var code int
		code, reason = ready()
		return code == http.StatusServiceUnavailable && reason == want
	})
	t.Logf("unready (%s) %v after the disk filled", reason, time.Since(filled).Round(10*time.Millisecond))
	if walFull == nil {
		stalled = b.count(t, `SELECT count(*) FROM widgets`)
		require.Less(t, stalled, events)
		time.Sleep(2 * time.Second) // paused: no effect commits meanwhile
		require.Equal(t, stalled, b.count(t, `SELECT count(*) FROM widgets`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM dead_letters`))
	} else {
		time.Sleep(2 * time.Second) // paused while the server is down
		require.Equal(t, want, func() string { _, r := ready(); return r }())
	}

	disk.Grow(t, 2*size)
	if walFull != nil {
		walFull.Start(t) // its recovery now has room
	}
	grown := time.Now()
	waitFor(t, "every effect", func() bool { return b.count(t, `SELECT count(DISTINCT event_id) FROM widgets`) == events })
	t.Logf("all %d effects %v after the disk grew (%d before it filled)", events, time.Since(grown).Round(10*time.Millisecond), stalled)
	require.Equal(t, events, b.count(t, `SELECT count(*) FROM widgets`), "each effect once")
	require.Zero(t, b.count(t, `SELECT count(*) FROM dead_letters`))
	waitFor(t, "/readyz ready again", func() bool { code, _ := ready(); return code == http.StatusOK })
}
