package testserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// RabbitMQ is a RabbitMQ node of a test's own: its own node name, ports
// and data folder, run as the rabbitmq user, management off. Tests
// restart it; they never touch the shared server.
type RabbitMQ struct {
	name string
	dir  string
	env  []string
	// URL is the node's AMQP URL, as guest.
	URL string
}

// ConsistentHashPlugin is the plugin of the consistent-hash exchange of
// partitioned consumers, which ships with rabbitmq-server.
const ConsistentHashPlugin = "rabbitmq_consistent_hash_exchange"

// StartRabbitMQ starts a private node with ConsistentHashPlugin and stops
// it, and removes its data, when the test ends.
func StartRabbitMQ(t *testing.T) *RabbitMQ {
	t.Helper()
	return StartRabbitMQWith(t, ConsistentHashPlugin)
}

// StartRabbitMQWith is StartRabbitMQ with plugins instead: none, for a
// test of a broker without the consistent-hash exchange.
func StartRabbitMQWith(t *testing.T, plugins ...string) *RabbitMQ {
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
	require.NoError(t, os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("["+strings.Join(plugins, ",")+"].\n"), 0o644))
	require.NoError(t, exec.Command("chown", "-R", "rabbitmq:rabbitmq", dir).Run())
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	port := freePort(t)
	n := &RabbitMQ{name: "effectively-" + hex.EncodeToString(b) + "@localhost", dir: dir}
	n.URL = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port)
	t.Cleanup(func() {
		_ = n.ctl("stop").Run()
		_ = os.RemoveAll(dir)
	})
	n.env = []string{
		"HOME=/var/lib/rabbitmq",
		"RABBITMQ_NODENAME=" + n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(port),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(freePort(t)),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "pid"),
	}
	n.Start(t)
	return n
}

// ctl returns rabbitmqctl on the node, run as the rabbitmq user.
func (n *RabbitMQ) ctl(args ...string) *exec.Cmd {
	return exec.Command("runuser", append([]string{"-u", "rabbitmq", "--", "env", "HOME=/var/lib/rabbitmq", "rabbitmqctl", "-q", "-n", n.name}, args...)...)
}

// Ctl runs rabbitmqctl on the node with args (e.g. "list_connections",
// "state") and returns its output; it fails the test when rabbitmqctl
// fails.
func (n *RabbitMQ) Ctl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := n.ctl(args...).CombinedOutput()
	require.NoError(t, err, "rabbitmqctl %v: %s", args, out)
	return string(out)
}

// Start starts the node detached and waits until it accepts AMQP
// connections.
func (n *RabbitMQ) Start(t *testing.T) {
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
			t.Fatalf("private RabbitMQ node %s did not start: %v; the end of its logs:\n%s", n.name, err, n.logTail(4<<10))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Stop stops the node and waits until it is gone.
func (n *RabbitMQ) Stop(t *testing.T) {
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

// logTail returns the last limit bytes of each of the node's log files
// (its folder goes when the test ends), each under its name.
func (n *RabbitMQ) logTail(limit int64) string {
	files, _ := filepath.Glob(filepath.Join(n.dir, "log", "*"))
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if int64(len(data)) > limit {
			data = data[int64(len(data))-limit:]
		}
		fmt.Fprintf(&b, "== %s\n%s\n", filepath.Base(f), data)
	}
	if b.Len() == 0 {
		return "(no log files in " + filepath.Join(n.dir, "log") + ")"
	}
	return b.String()
}
