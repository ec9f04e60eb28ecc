package testserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// StandbyName is the application_name of a Pair's standby on its
// replication connection, which a synchronous primary names in
// synchronous_standby_names.
const StandbyName = "effectively_standby"

// Pair is a primary of a test's own with a streaming standby made from it
// by pg_basebackup, for the tests of a failover: kill the primary
// (Primary.Kill), promote the standby (Standby.Promote), and the clients
// given URL go on against the standby. Both are stopped and removed when
// the test ends.
type Pair struct {
	// Primary is the cluster that takes the writes.
	Primary *Postgres
	// Standby replays the primary's WAL, read-only until promoted.
	Standby *Postgres
	// Sync says whether the primary waits for the standby: every commit
	// it reports was written to the standby's disk first.
	Sync bool
}

// StartPair starts a primary and a standby that streams its WAL. With
// sync, the primary's synchronous_standby_names names the standby
// (StandbyName) and synchronous_commit is on: a commit returns once the
// standby flushed it. Without, replication is asynchronous: a commit
// returns at once, and what the standby has not received when the
// primary dies is lost with it. The setting is the primary's command
// line, not its files: the standby, made from a copy of them, would
// otherwise wait, once promoted, for a standby of its own that never
// comes. StartPair returns once the standby streams (in sync mode, as
// the synchronous one).
func StartPair(t *testing.T, sync bool) *Pair {
	t.Helper()
	p := &Pair{Primary: StartPostgres(t), Sync: sync}
	if sync {
		p.Primary.settings = []string{"synchronous_standby_names=" + StandbyName, "synchronous_commit=on"}
		p.Primary.Restart(t)
	}
	p.Standby = newPostgres(t)
	out, err := p.Standby.asPostgres(filepath.Join(pgBin, "pg_basebackup"),
		"-h", "127.0.0.1", "-p", fmt.Sprint(p.Primary.port), "-U", "postgres",
		"-D", p.Standby.data(), "-R", "-X", "stream", "--no-sync").CombinedOutput()
	require.NoError(t, err, "pg_basebackup: %s", out)
	// -R wrote standby.signal and a primary_conninfo; this one, later in
	// the file, wins and names the standby.
	conninfo := fmt.Sprintf("\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=%s'\n", p.Primary.port, StandbyName)
	f, err := os.OpenFile(filepath.Join(p.Standby.data(), "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(conninfo)
	require.NoError(t, errors.Join(err, f.Close()))
	p.Standby.Start(t)
	state := "async"
	if sync {
		state = "sync"
	}
	p.waitPrimary(t, "the standby streams", `SELECT count(*) = 1 FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2`, StandbyName, state)
	return p
}

// URL returns the URL of database db on both clusters, primary first,
// with target_session_attrs=read-write, as a service configured for a
// failover is given it: a client connects to the first that accepts
// writes. The password is there for the URL's form only (the clusters
// trust every local connection).
func (p *Pair) URL(db string) string {
	return fmt.Sprintf("postgres://postgres:secret@%s,%s/%s?sslmode=disable&target_session_attrs=read-write", p.Primary.Addr(), p.Standby.Addr(), db)
}

// WaitReplayed waits until the standby has replayed every WAL record the
// primary has written.
func (p *Pair) WaitReplayed(t *testing.T) {
	t.Helper()
	p.waitPrimary(t, "the standby replays everything", `SELECT count(*) = 1 FROM pg_stat_replication WHERE application_name = $1 AND replay_lsn >= pg_current_wal_lsn()`, StandbyName)
}

// waitPrimary waits up to a minute for query, on the primary, to return
// true.
func (p *Pair) waitPrimary(t *testing.T, what, query string, args ...any) {
	t.Helper()
	db := p.Primary.open(t)
	defer db.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		var ok bool
		err := db.QueryRow(query, args...).Scan(&ok)
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute (last error: %v)", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Restart stops the cluster (fast) and starts it again, with its
// settings as they are now.
func (c *Postgres) Restart(t *testing.T) {
	t.Helper()
	c.Stop(t)
	c.Start(t)
}

// Kill stops the cluster as a crash does (pg_ctl stop -m immediate):
// its processes end at once, without a checkpoint, and every connection
// is cut.
func (c *Postgres) Kill(t *testing.T) {
	t.Helper()
	out, err := c.pgctl("stop", "-m", "immediate").CombinedOutput()
	require.NoError(t, err, "pg_ctl stop -m immediate: %s", out)
}

// Promote makes a standby a primary (pg_ctl promote) and waits until it
// accepts writes.
func (c *Postgres) Promote(t *testing.T) {
	t.Helper()
	out, err := c.pgctl("promote").CombinedOutput()
	require.NoError(t, err, "pg_ctl promote: %s", out)
	db := c.open(t)
	defer db.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		var recovering bool
		err := db.QueryRow(`SELECT pg_is_in_recovery()`).Scan(&recovering)
		if err == nil && !recovering {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the promoted standby does not accept writes within a minute (last error: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// DatabaseURL is the URL of the cluster's database db, as its superuser.
func (c *Postgres) DatabaseURL(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", c.Addr(), db)
}

// open opens a pool of one connection on the cluster's postgres
// database.
func (c *Postgres) open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", c.URL)
	require.NoError(t, err)
	db.SetMaxOpenConns(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, db.PingContext(ctx), "connect to %s", c.Addr())
	return db
}
