package soak

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PostgresBin is where Debian's PostgreSQL 15 programs are.
const PostgresBin = "/usr/lib/postgresql/15/bin"

// ErrMissing wraps a missing prerequisite (a program, a user).
var ErrMissing = errors.New("soak: missing prerequisite")

// Postgres is a PostgreSQL server of the soak's own: initdb as the
// postgres user in a folder that user owns, on a loopback port.
type Postgres struct {
	dir  string
	port int
}

// StartPostgres creates and starts a server in a new folder under
// os.TempDir (/var/tmp when it exists, which outlives a tmpfs /tmp).
func StartPostgres(ctx context.Context) (*Postgres, error) {
	for _, prog := range []string{"initdb", "pg_ctl"} {
		if _, err := os.Stat(filepath.Join(PostgresBin, prog)); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrMissing, prog, err)
		}
	}
	dir, err := ownedDir("effectively-soak-postgres-", "postgres")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	pg := &Postgres{dir: dir, port: port}
	if err := asUser(ctx, "postgres", nil, filepath.Join(PostgresBin, "initdb"), "-D", pg.data(), "-U", "postgres",
		"-A", "trust", "--no-sync", "-E", "UTF8"); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w", err)
	}
	if err := pg.start(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := watch("postgres", nil, dir, filepath.Join(PostgresBin, "pg_ctl"), "-D", pg.data(), "-m", "immediate", "stop"); err != nil {
		_ = pg.Close(ctx)
		return nil, err
	}
	return pg, nil
}

func (p *Postgres) data() string { return filepath.Join(p.dir, "data") }

// URL is the server's postgres:// URL.
func (p *Postgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

func (p *Postgres) start(ctx context.Context) error {
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c max_connections=400 -c fsync=off -c shared_buffers=64MB", p.port, p.dir)
	if err := asUser(ctx, "postgres", nil, filepath.Join(PostgresBin, "pg_ctl"), "-D", p.data(), "-l", filepath.Join(p.dir, "log"),
		"-w", "-t", "120", "-o", opts, "start"); err != nil {
		return fmt.Errorf("start PostgreSQL: %w (log in %s)", err, filepath.Join(p.dir, "log"))
	}
	return nil
}

// Restart stops the server in immediate mode (as a crash would: recovery
// at start) and starts it again.
func (p *Postgres) Restart(ctx context.Context) error {
	if err := p.stop(ctx, "immediate"); err != nil {
		return err
	}
	return p.start(ctx)
}

func (p *Postgres) stop(ctx context.Context, mode string) error {
	if err := asUser(ctx, "postgres", nil, filepath.Join(PostgresBin, "pg_ctl"), "-D", p.data(), "-m", mode, "-w", "stop"); err != nil {
		return fmt.Errorf("stop PostgreSQL: %w", err)
	}
	return nil
}

// Close stops the server and removes its folder.
func (p *Postgres) Close(ctx context.Context) error {
	err := p.stop(ctx, "fast")
	return errors.Join(err, os.RemoveAll(p.dir))
}

// RabbitNode is a RabbitMQ node of the soak's own, run as the rabbitmq
// user with its data in a folder that user owns, as scripts/services.sh
// runs the tests' node.
type RabbitNode struct {
	Name           string
	dir            string
	port, distPort int
}

// NewRabbitNode prepares an empty node name@localhost in a new folder.
func NewRabbitNode(name string) (*RabbitNode, error) {
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		return nil, fmt.Errorf("%w: rabbitmq-server: %w", ErrMissing, err)
	}
	dir, err := ownedDir("effectively-soak-rabbitmq-", "rabbitmq")
	if err != nil {
		return nil, err
	}
	n := &RabbitNode{Name: name + "@localhost", dir: dir}
	if n.port, err = freePort(); err != nil {
		return nil, err
	}
	if n.distPort, err = freePort(); err != nil {
		return nil, err
	}
	// The consistent-hash exchange of partitioned consumers; the plugin
	// ships with rabbitmq-server.
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[rabbitmq_consistent_hash_exchange].\n"), 0o644); err != nil {
		return nil, fmt.Errorf("rabbitmq plugins: %w", err)
	}
	if err := chown(filepath.Join(dir, "enabled_plugins"), "rabbitmq"); err != nil {
		return nil, err
	}
	return n, watch("rabbitmq", n.env(), dir, "rabbitmqctl", "-q", "-n", n.Name, "stop")
}

// URL is the node's amqp:// URL.
func (n *RabbitNode) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

func (n *RabbitNode) env() []string {
	return []string{
		"HOME=/var/lib/rabbitmq", // its .erlang.cookie, shared by the nodes
		"RABBITMQ_NODENAME=" + n.Name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(n.distPort),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(n.dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(n.dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(n.dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE=" + filepath.Join(n.dir, "pid"),
	}
}

// Start starts the node and waits for its AMQP listener.
func (n *RabbitNode) Start(ctx context.Context) error {
	if err := asUser(ctx, "rabbitmq", n.env(), "rabbitmq-server", "-detached"); err != nil {
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	return n.awaitListener(ctx, 3*time.Minute)
}

func (n *RabbitNode) awaitListener(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.port), time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not listen on port %d (logs in %s)", n.Name, n.port, filepath.Join(n.dir, "log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Ctl runs rabbitmqctl on the node.
func (n *RabbitNode) Ctl(ctx context.Context, args ...string) error {
	return asUser(ctx, "rabbitmq", n.env(), "rabbitmqctl", append([]string{"-q", "-n", n.Name}, args...)...)
}

// Join makes the node a member of first's cluster.
func (n *RabbitNode) Join(ctx context.Context, first *RabbitNode) error {
	for _, args := range [][]string{{"stop_app"}, {"join_cluster", first.Name}, {"start_app"}} {
		if err := n.Ctl(ctx, args...); err != nil {
			return fmt.Errorf("%s: %s: %w", n.Name, args[0], err)
		}
	}
	return n.awaitListener(ctx, 3*time.Minute)
}

// Kill kills the node's Erlang VM with SIGKILL.
func (n *RabbitNode) Kill() error {
	b, err := os.ReadFile(filepath.Join(n.dir, "pid"))
	if err != nil {
		return fmt.Errorf("pid of %s: %w", n.Name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("pid of %s: %w", n.Name, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s: %w", n.Name, err)
	}
	for deadline := time.Now().Add(10 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d) still runs 10s after SIGKILL", n.Name, pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// alive reports whether process pid runs: it exists and is no zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// Close stops the node and removes its folder.
func (n *RabbitNode) Close(ctx context.Context) error {
	err := n.Ctl(ctx, "stop")
	return errors.Join(err, os.RemoveAll(n.dir))
}

// watchScript waits while process $1 runs and folder $2 exists; when the
// process ended first, it runs the rest of its arguments, a server's stop,
// and removes the folder.
const watchScript = `while [ -d "/proc/$1" ] && [ -d "$2" ]; do sleep 1; done
if [ -d "$2" ]; then dir=$2; shift 2; "$@"; rm -rf "$dir"; fi`

// watch starts, as user with env added, a watchdog of a server that
// keeps its data in dir: when this process ends before it removed dir (a
// run killed before it stopped its servers), it runs stop and removes
// dir, so that no server of the soak outlives it. Once dir is removed,
// the watchdog ends within a second.
func watch(user string, env []string, dir string, stop ...string) error {
	args := append([]string{"-u", user, "--", "env"}, env...)
	args = append(args, "sh", "-c", watchScript, "watch", strconv.Itoa(os.Getpid()), dir)
	cmd := exec.Command("runuser", append(args, stop...)...)
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("watchdog of %s: %w", dir, err)
	}
	go func() { _ = cmd.Wait() }()
	return nil
}

// closeInheritedOnExec marks close-on-exec the descriptors above stderr
// that this process inherited, so that the servers and services the
// soak starts do not inherit them: a lock that the caller of make test
// holds on a file (flock) would otherwise live on in a PostgreSQL server
// or a RabbitMQ node, daemons that outlive a run killed before it stopped
// them.
func closeInheritedOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

// ownedDir creates a folder under /var/tmp (or os.TempDir) that user owns.
func ownedDir(pattern, user string) (string, error) {
	base := "/var/tmp"
	if _, err := os.Stat(base); err != nil {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, pattern)
	if err != nil {
		return "", fmt.Errorf("soak folder: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("soak folder: %w", err)
	}
	return dir, chown(dir, user)
}

func chown(path, user string) error {
	if out, err := exec.Command("chown", user+":"+user, path).CombinedOutput(); err != nil {
		return fmt.Errorf("%w: chown %s to %s: %w: %s", ErrMissing, path, user, err, out)
	}
	return nil
}

// asUser runs a program as user with env added, returning its output in
// the error when it fails.
func asUser(ctx context.Context, user string, env []string, prog string, args ...string) error {
	full := append([]string{"-u", user, "--", "env"}, env...)
	full = append(full, append([]string{prog}, args...)...)
	cmd := exec.CommandContext(ctx, "runuser", full...)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
