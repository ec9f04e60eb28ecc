package testserver

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// pgBin is where Debian keeps PostgreSQL 15's server programs.
const pgBin = "/usr/lib/postgresql/15/bin"

// Postgres is a PostgreSQL cluster of a test's own: initdb in a folder the
// postgres user owns, on a port of its own, started and stopped with
// pg_ctl as the postgres user. Tests restart it; they never touch the
// shared server.
type Postgres struct {
	dir  string
	port int
	// settings are the server's -c settings beyond the ones Start
	// always gives, e.g. a primary's synchronous_standby_names.
	settings []string
	// URL is the cluster's postgres database, as its superuser.
	URL string
}

// StartPostgres starts a private cluster and stops it, and removes its
// data, when the test ends.
func StartPostgres(t *testing.T) *Postgres {
	t.Helper()
	requirePrograms(t)
	c := newPostgres(t)
	out, err := c.asPostgres(filepath.Join(pgBin, "initdb"), "-D", c.data(), "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	c.Start(t)
	return c
}

// StartPostgresOnDisk is StartPostgres with the cluster's data directory
// on a disk of its own of size bytes (see MountDisk), for the tests of a
// full disk; its log is elsewhere. The disk is unmounted after the
// cluster stops.
func StartPostgresOnDisk(t *testing.T, size int64) (*Postgres, *Disk) {
	t.Helper()
	requirePrograms(t)
	c := newPostgres(t)
	require.NoError(t, os.Mkdir(c.data(), 0o700))
	disk := mountDisk(t, c.data(), size, "0700")
	t.Cleanup(func() { _ = c.pgctl("stop", "-m", "immediate").Run() }) // before the unmount
	require.NoError(t, exec.Command("chown", "postgres:postgres", c.data()).Run())
	out, err := c.asPostgres(filepath.Join(pgBin, "initdb"), "-D", c.data(), "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	c.Start(t)
	return c, disk
}

// requirePrograms skips the test, or fails it under CI=true, when a
// private cluster cannot be run here.
func requirePrograms(t *testing.T) {
	t.Helper()
	testenv.Require(t, testenv.PostgresURLVar)
	for _, prog := range []string{"initdb", "pg_ctl", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(pgBin, prog)); err != nil {
			testenv.Missing(t, "PostgreSQL's server programs (%s) are not installed here (the shared server runs elsewhere)", prog)
		}
	}
	if _, err := user.Lookup("postgres"); err != nil {
		testenv.Missing(t, "no postgres user to run a private cluster as")
	}
}

// newPostgres returns a cluster with no data yet: its folder, owned by
// the postgres user, and its port. When the test ends the cluster is
// stopped and its folder removed.
func newPostgres(t *testing.T) *Postgres {
	t.Helper()
	dir, err := os.MkdirTemp("", "effectively-postgres-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, exec.Command("chown", "postgres:postgres", dir).Run())
	c := &Postgres{dir: dir, port: freePort(t)}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	t.Cleanup(func() {
		_ = c.pgctl("stop", "-m", "immediate").Run()
		_ = os.RemoveAll(dir)
	})
	return c
}

// Addr is the cluster's host:port on loopback.
func (c *Postgres) Addr() string { return fmt.Sprintf("127.0.0.1:%d", c.port) }

func (c *Postgres) data() string { return filepath.Join(c.dir, "data") }

func (c *Postgres) asPostgres(args ...string) *exec.Cmd {
	return exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...)
}

func (c *Postgres) pgctl(args ...string) *exec.Cmd {
	return c.asPostgres(append([]string{filepath.Join(pgBin, "pg_ctl"), "-D", c.data(), "-w", "-t", "60"}, args...)...)
}

// Start starts the cluster and waits until it accepts connections.
func (c *Postgres) Start(t *testing.T) {
	t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", c.port, c.dir)
	for _, s := range c.settings {
		opts += " -c " + s
	}
	out, err := c.pgctl("start", "-o", opts, "-l", filepath.Join(c.dir, "log")).CombinedOutput()
	require.NoError(t, err, "pg_ctl start: %s", out)
}

// Stop stops the cluster at once, cutting every connection.
func (c *Postgres) Stop(t *testing.T) {
	t.Helper()
	out, err := c.pgctl("stop", "-m", "fast").CombinedOutput()
	require.NoError(t, err, "pg_ctl stop: %s", out)
}
