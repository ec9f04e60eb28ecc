package postgres_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/transporttest"
	"github.com/effectively-once/effectively/internal/testenv"
)

// pgBin is where Debian keeps PostgreSQL 15's server programs.
const pgBin = "/usr/lib/postgresql/15/bin"

// cluster is a PostgreSQL cluster of a test's own, beside the shared
// server: initdb in a folder the postgres user owns, on a port of its own,
// started and stopped with pg_ctl as the postgres user. Tests restart it;
// they never touch the shared server.
type cluster struct {
	dir  string
	port int
	URL  string
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	testenv.Require(t, testenv.PostgresURLVar)
	if _, err := os.Stat(filepath.Join(pgBin, "initdb")); err != nil {
		testenv.Missing(t, "PostgreSQL's server programs are not installed here (the shared server runs elsewhere)")
	}
	if _, err := user.Lookup("postgres"); err != nil {
		testenv.Missing(t, "no postgres user to run a private cluster as")
	}
	dir, err := os.MkdirTemp("", "effectively-postgres-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, exec.Command("chown", "postgres:postgres", dir).Run())
	c := &cluster{dir: dir, port: freePort(t)}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	t.Cleanup(func() {
		_ = c.pgctl("stop", "-m", "immediate").Run()
		_ = os.RemoveAll(dir)
	})
	out, err := c.asPostgres(filepath.Join(pgBin, "initdb"), "-D", c.data(), "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	c.start(t)
	return c
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (c *cluster) data() string { return filepath.Join(c.dir, "data") }

func (c *cluster) asPostgres(args ...string) *exec.Cmd {
	return exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...)
}

func (c *cluster) pgctl(args ...string) *exec.Cmd {
	return c.asPostgres(append([]string{filepath.Join(pgBin, "pg_ctl"), "-D", c.data(), "-w", "-t", "60"}, args...)...)
}

func (c *cluster) start(t *testing.T) {
	t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", c.port, c.dir)
	out, err := c.pgctl("start", "-o", opts, "-l", filepath.Join(c.dir, "log")).CombinedOutput()
	require.NoError(t, err, "pg_ctl start: %s", out)
}

// stop stops the cluster at once, cutting every connection.
func (c *cluster) stop(t *testing.T) {
	t.Helper()
	out, err := c.pgctl("stop", "-m", "fast").CombinedOutput()
	require.NoError(t, err, "pg_ctl stop: %s", out)
}

// TestServerRestart restarts a private PostgreSQL cluster, which holds
// the transport's tables, while a subscriber drains a backlog: the
// subscriber and the publisher's pool reconnect by themselves and nothing
// is lost.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	env := postgresEnv(t, c.URL)
	env.Timeout = 90 * time.Second
	transporttest.ExerciseServerRestart(t, env, func(t *testing.T) {
		c.stop(t)
		time.Sleep(time.Second)
		c.start(t)
	})
}
