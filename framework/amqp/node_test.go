package amqp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// node is a RabbitMQ node of a test's own, beside the shared one: its own
// node name, ports and data folder, run as the rabbitmq user, management
// off. Tests restart it; they never touch the shared server.
type node struct {
	name string
	port int
	dir  string
	env  []string
	URL  string
}

// startNode starts a private node and stops it, and removes its data, when
// the test ends. It needs the shared server's installation: where the
// shared server is not there the test is skipped (or fails under CI=true).
func startNode(t *testing.T) *node {
	t.Helper()
	testenv.Require(t, testenv.AMQPURLVar)
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		testenv.Missing(t, "rabbitmq-server is not installed here (the shared server runs elsewhere)")
	}
	if _, err := user.Lookup("rabbitmq"); err != nil {
		testenv.Missing(t, "no rabbitmq user to run a private node as")
	}
	dir, err := os.MkdirTemp("", "effectively-rabbitmq-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644))
	require.NoError(t, exec.Command("chown", "-R", "rabbitmq:rabbitmq", dir).Run())
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	n := &node{name: "effectively-" + hex.EncodeToString(b) + "@localhost", port: freePort(t), dir: dir}
	n.URL = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port)
	dist := freePort(t)
	t.Cleanup(func() {
		_ = n.ctl("stop").Run()
		_ = os.RemoveAll(dir)
	})
	n.env = []string{
		"HOME=/var/lib/rabbitmq",
		"RABBITMQ_NODENAME=" + n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(dist),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "pid"),
	}
	n.start(t)
	return n
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// ctl returns rabbitmqctl on the node, run as the rabbitmq user.
func (n *node) ctl(args ...string) *exec.Cmd {
	return exec.Command("runuser", append([]string{"-u", "rabbitmq", "--", "env", "HOME=/var/lib/rabbitmq", "rabbitmqctl", "-q", "-n", n.name}, args...)...)
}

// start starts the node detached and waits until it accepts AMQP
// connections.
func (n *node) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command("runuser", append(append([]string{"-u", "rabbitmq", "--", "env"}, n.env...), "rabbitmq-server", "-detached")...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "rabbitmq-server: %s", out)
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := amqp091.Dial(n.URL)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("private RabbitMQ node %s did not start: %v (logs in %s)", n.name, err, n.dir)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stop stops the node and waits until it is gone.
func (n *node) stop(t *testing.T) {
	t.Helper()
	out, err := n.ctl("stop").CombinedOutput()
	require.NoError(t, err, "rabbitmqctl stop: %s", out)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		c, err := amqp091.Dial(n.URL)
		if err != nil {
			return
		}
		_ = c.Close()
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("private RabbitMQ node %s did not stop", n.name)
}

func randomHex() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
