package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// The crash tests run the service as a subprocess (the test binary itself,
// see TestMain), kill it with SIGKILL at one step of a delivery, restart it
// and check that the effect happened exactly once.

// waitLimit bounds every wait of these tests. It is far above what a
// healthy run needs (a few seconds: the subscriber polls every second and
// the leases below expire after about 2 s), so it fails only on a hang.
const waitLimit = 45 * time.Second

// crashConfig keeps the consumer's timeout short, so that the SQLite lease
// (twice the timeout, 2 s; renewed while the process lives) of a message
// whose process died expires quickly. The concurrency is the default: the
// message published behind crash-me is in flight with it at every crash,
// and the delivery guard must not count it towards the limit.
const crashConfig = `defaults:
  max_deliveries: 3
  attempts: 1
  timeout: 1s
  retry_delay: 10ms
`

// shutdownConfig gives the blocked attempt of the shutdown test time to be
// interrupted by SIGTERM rather than by its timeout.
const shutdownConfig = `defaults:
  max_deliveries: 3
  attempts: 1
  timeout: 20s
  retry_delay: 10ms
`

// crashBundle is one test's service: its files and the databases the test
// reads.
type crashBundle struct {
	dir        string
	dbPath     string
	transport  string // the transport's file; dbPath unless separate
	configPath string
	marker     string
	db         *sqlx.DB // the stores' file
	tdb        *sqlx.DB // the transport's file (db when shared)
}

type crashSetup struct {
	// separateTransport puts the transport's messages in a file of their
	// own, so that the ack is not part of the handler's transaction.
	separateTransport bool
	config            string
}

func setupCrash(t *testing.T, cfg crashSetup) *crashBundle {
	t.Helper()
	dir := t.TempDir()
	b := &crashBundle{
		dir:        dir,
		dbPath:     filepath.Join(dir, "data", "notifications.db"),
		configPath: filepath.Join(dir, "effectively.yaml"),
		marker:     filepath.Join(dir, "crashed"),
	}
	b.transport = b.dbPath
	if cfg.separateTransport {
		b.transport = filepath.Join(dir, "data", "transport.db")
	}
	require.NoError(t, os.WriteFile(b.configPath, []byte(cfg.config), 0o600))

	ctx := context.Background()
	var err error
	b.db, err = sqlite.Open(ctx, b.dbPath, sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.db.Close() })
	b.tdb = b.db
	if cfg.separateTransport {
		b.tdb, err = sqlite.Open(ctx, b.transport, sqlite.OpenConfig{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.tdb.Close() })
	}
	return b
}

// publish publishes a booking per event id to the transport's file, as
// another process would.
func (b *crashBundle) publish(t *testing.T, ids ...string) {
	t.Helper()
	pub, err := sqlite.NewPublisher(b.tdb, sqlite.PublisherConfig{})
	require.NoError(t, err)
	defer pub.Close()
	for _, id := range ids {
		env, err := appointments.Booked.Envelope(
			appointments.BookedV1{AppointmentID: "appt-" + id, StartsAt: time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)},
			framework.Attributes{ID: id, Source: appointments.Source},
		)
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NoError(t, pub.Publish(appointments.Booked.Type(), msg))
	}
}

// service is one run of the service subprocess.
type service struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited
	err  error         // cmd.Wait's result, set before done closes
	// ready names the file the service creates once it started (see
	// readyFile).
	ready string
}

// start runs the service (`serve`) with the hook of mode.
func (b *crashBundle) start(t *testing.T, mode string) *service {
	t.Helper()
	transportURL := ""
	if b.transport != b.dbPath {
		transportURL = b.transport
	}
	return startService(t, b.dir, mode,
		envCrashMarker+"="+b.marker,
		app.EnvTransport+"=sqlite",
		app.EnvDatabaseURL+"="+b.dbPath,
		app.EnvTransportURL+"="+transportURL,
		app.EnvTablePrefix+"=",
		app.EnvAutoMigrate+"=true",
		app.EnvHTTPAddr+"=",
		app.EnvConfig+"="+b.configPath,
	)
}

// startService runs the service (`serve`) with the hook of mode and the
// environment env on top of the test's, logging to a file in dir that the
// test prints when it fails.
func startService(t *testing.T, dir, mode string, env ...string) *service {
	t.Helper()
	logPath := filepath.Join(dir, fmt.Sprintf("service-%d.log", time.Now().UnixNano()))
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	defer logFile.Close() // the child has its own descriptor

	ready := strings.TrimSuffix(logPath, ".log") + ".ready"
	cmd := exec.Command(os.Args[0], "serve")
	cmd.Env = append(append(os.Environ(), envCrashMode+"="+mode, envCrashReady+"="+ready), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The kernel kills the service when the test process dies first (a
	// go test -timeout, a Ctrl-C): see testenv.StartChild.
	waited, err := testenv.StartChild(cmd)
	require.NoError(t, err)
	s := &service{cmd: cmd, done: make(chan struct{}), ready: ready}
	go func() {
		s.err = <-waited
		close(s.done)
	}()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = cmd.Process.Kill()
			<-s.done
		}
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("log of service pid %d (%s):\n%s", cmd.Process.Pid, mode, out)
			logNotable(t, cmd.Process.Pid, string(out))
		}
	})
	return s
}

// wait waits for the process to exit and returns its status.
func (s *service) wait(t *testing.T) syscall.WaitStatus {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(waitLimit):
		t.Fatalf("service pid %d did not exit within %s", s.cmd.Process.Pid, waitLimit)
	}
	ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok, "wait status of %T", s.cmd.ProcessState.Sys())
	return ws
}

// waitKilled waits until the hook killed the process.
func (s *service) waitKilled(t *testing.T) {
	t.Helper()
	ws := s.wait(t)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL,
		"want the service killed by SIGKILL, got %v (%v)", ws, s.err)
}

// waitKilledUnless waits until the hook killed the process, and fails
// when failed holds first, for longer than killGrace: what the hook waits
// for will not come.
func (s *service) waitKilledUnless(t *testing.T, why string, failed func() bool) {
	t.Helper()
	deadline := time.After(waitLimit)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var failedSince time.Time
	for {
		select {
		case <-s.done:
			s.waitKilled(t)
			return
		case <-deadline:
			t.Fatalf("service pid %d was not killed within %s", s.cmd.Process.Pid, waitLimit)
		case <-tick.C:
			// What failed reads may show before the kill it precedes
			// (an effect committed at after_commit, say): it fails the
			// test only once it has held for killGrace without a kill.
			switch {
			case !failed():
				failedSince = time.Time{}
			case failedSince.IsZero():
				failedSince = time.Now()
			case time.Since(failedSince) > killGrace:
				t.Fatalf("service pid %d not killed: %s", s.cmd.Process.Pid, why)
			}
		}
	}
}

// killGrace is how long waitKilledUnless gives a process whose work is
// visible to die at the point that follows it, however loaded the
// machine.
const killGrace = 5 * time.Second

// stop sends SIGTERM, once the service started, and checks that it stops
// cleanly.
func (s *service) stop(t *testing.T) {
	t.Helper()
	s.waitFor(t, "the service to start", func() bool {
		_, err := os.Stat(s.ready)
		return err == nil
	})
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-s.done:
	case <-time.After(stopDump):
		// Stuck: SIGQUIT makes the Go runtime write every goroutine's
		// stack to the log, which the test prints as it fails.
		_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	}
	ws := s.wait(t)
	require.True(t, ws.Exited() && ws.ExitStatus() == 0, "want exit status 0 after SIGTERM, got %v (%v)", ws, s.err)
}

// stopDump is how long stop waits after SIGTERM before it asks the
// service for its goroutines' stacks (SIGQUIT), which fails the test: a
// little less than the service's own stop timeout (fx's default, 15 s),
// after which it would exit 1 on its own without them. A healthy stop
// takes a few seconds, TestGracefulShutdown's about 8 (it drains for
// half the stop timeout).
const stopDump = 14 * time.Second

// waitFor polls cond until it holds; the service must stay up meanwhile.
func (b *crashBundle) waitFor(t *testing.T, s *service, what string, cond func() bool) {
	t.Helper()
	s.waitFor(t, what, cond)
}

// waitFor polls cond until it holds; the service must stay up meanwhile.
func (s *service) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(waitLimit)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-s.done:
			t.Fatalf("service exited (%v) while waiting for %s", s.err, what)
		case <-deadline:
			t.Fatalf("no %s within %s", what, waitLimit)
		case <-tick.C:
		}
	}
}

// count runs a count query; a missing table (the service has not migrated
// yet) counts as -1.
func count(db *sqlx.DB, query string, args ...any) int {
	var n int
	if err := db.Get(&n, query, args...); err != nil {
		return -1
	}
	return n
}

func (b *crashBundle) reminders(id string) int {
	return count(b.db, `SELECT count(*) FROM reminders WHERE event_id = ?`, id)
}

func (b *crashBundle) marks(id string) int {
	return count(b.db, `SELECT count(*) FROM processed_events WHERE consumer = ? AND event_id = ?`, ConsumerName, id)
}

func (b *crashBundle) deadLetters(id string) int {
	return count(b.db, `SELECT count(*) FROM dead_letters WHERE consumer = ? AND event_id = ?`, ConsumerName, id)
}

// leases counts the messages of the consumer that are claimed and not
// acknowledged.
func (b *crashBundle) leases() int {
	return count(b.tdb, `SELECT count(*) FROM pubsub_leases WHERE consumer_group = ?`, ConsumerName)
}

// unacked counts the messages of the consumer not acknowledged yet:
// leased, or never claimed.
func (b *crashBundle) unacked() int {
	n := count(b.tdb, `SELECT count(*) FROM pubsub_messages m WHERE m.topic = ? AND (
		m."offset" > COALESCE((SELECT claimed_offset FROM pubsub_groups g WHERE g.topic = m.topic AND g.consumer_group = ?), 0)
		OR EXISTS (SELECT 1 FROM pubsub_leases l WHERE l.topic = m.topic AND l.consumer_group = ? AND l."offset" = m."offset"))`,
		appointments.Booked.Type(), ConsumerName, ConsumerName)
	return n
}

// requireOnce checks that the event's effect and mark exist once, and that
// it is not a dead letter.
func (b *crashBundle) requireOnce(t *testing.T, id string) {
	t.Helper()
	require.Equal(t, 1, b.reminders(id), "reminders of %s", id)
	require.Equal(t, 1, b.marks(id), "processed marks of %s", id)
	require.Equal(t, 0, b.deadLetters(id), "dead letters of %s", id)
}

// handled reports whether the events' effects exist and every message is
// acknowledged.
func (b *crashBundle) handled(ids ...string) func() bool {
	return func() bool {
		for _, id := range ids {
			if b.reminders(id) < 1 {
				return false
			}
		}
		return b.unacked() == 0
	}
}

func TestCrash(t *testing.T) {
	t.Parallel()

	t.Run("BeforeCommit", func(t *testing.T) {
		t.Parallel()
		// The transport shares the stores' file: the ack is part of the
		// transaction the kill interrupts.
		b := setupCrash(t, crashSetup{config: crashConfig})
		b.publish(t, "before-commit")

		b.start(t, modeBeforeCommit).waitKilled(t)
		require.Equal(t, 0, b.reminders("before-commit"), "the killed attempt's writes rolled back")
		require.Equal(t, 0, b.marks("before-commit"), "the killed attempt's mark rolled back")
		require.Equal(t, 1, b.leases(), "the message is not acknowledged")

		s := b.start(t, modeBeforeCommit) // the marker exists: runs normally
		b.waitFor(t, s, "reminder after restart", b.handled("before-commit"))
		s.stop(t)
		b.requireOnce(t, "before-commit")
	})

	t.Run("AfterCommitBeforeAck", func(t *testing.T) {
		t.Parallel()
		// The transport in a file of its own: the ack comes after the
		// commit, and the kill falls between them.
		b := setupCrash(t, crashSetup{config: crashConfig, separateTransport: true})
		b.publish(t, "before-ack")

		b.start(t, modeBeforeAck).waitKilled(t)
		require.Equal(t, 1, b.reminders("before-ack"), "the effect committed before the kill")
		require.Equal(t, 1, b.marks("before-ack"))
		require.Equal(t, 1, b.leases(), "the message is not acknowledged")

		s := b.start(t, modeBeforeAck)
		b.waitFor(t, s, "the redelivery acknowledged", b.handled("before-ack"))
		s.stop(t)
		b.requireOnce(t, "before-ack")
	})

	t.Run("EveryDelivery", func(t *testing.T) {
		t.Parallel()
		b := setupCrash(t, crashSetup{config: crashConfig})
		b.publish(t, crashMeID, afterCrashID)

		// max_deliveries is 3: the first three deliveries kill the
		// process, the fourth is refused by the delivery guard. The hook
		// holds after-crash in flight until crash-me's attempt starts, so
		// each kill finds it delivered and not acknowledged: it must not
		// reach the limit with crash-me.
		for range 3 {
			b.start(t, modeEveryDelivery).waitKilled(t)
		}
		s := b.start(t, modeEveryDelivery)
		b.waitFor(t, s, "crash-me dead-lettered and after-crash handled", func() bool {
			return b.deadLetters(crashMeID) == 1 && b.handled(afterCrashID)()
		})
		s.stop(t)

		b.requireOnce(t, afterCrashID)
		require.Equal(t, 0, b.reminders(crashMeID))
		require.Equal(t, 0, b.marks(crashMeID))
		var dl struct {
			Code     string `db:"code"`
			Attempts int    `db:"attempts"`
			Status   string `db:"status"`
		}
		require.NoError(t, b.db.Get(&dl, `SELECT code, attempts, status FROM dead_letters WHERE consumer = ? AND event_id = ?`, ConsumerName, crashMeID))
		require.Equal(t, string(framework.CodeDeliveryLimit), dl.Code)
		require.Equal(t, string(driver.DeadLetterPending), dl.Status)
	})
}

// TestGracefulShutdown stops the service with SIGTERM while an attempt is
// blocked after the handler's writes: the attempt rolls back, the message
// is neither acknowledged nor dead-lettered, and the restarted service
// handles it once.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	b := setupCrash(t, crashSetup{config: shutdownConfig})
	b.publish(t, "shutdown")

	s := b.start(t, modeBlock)
	b.waitFor(t, s, "the attempt to block", func() bool {
		_, err := os.Stat(b.marker)
		return err == nil
	})
	s.stop(t)
	require.Equal(t, 0, b.reminders("shutdown"), "the interrupted attempt's writes rolled back")
	require.Equal(t, 0, b.marks("shutdown"), "the interrupted attempt's mark rolled back")
	require.Equal(t, 0, b.deadLetters("shutdown"), "shutdown never dead-letters")
	require.Equal(t, 1, b.unacked(), "the message is not acknowledged")

	s = b.start(t, modeBlock) // the marker exists: runs normally
	b.waitFor(t, s, "reminder after restart", b.handled("shutdown"))
	s.stop(t)
	b.requireOnce(t, "shutdown")
}

// logNotable logs the last warnings, errors and partition moves of a
// service's log, a line each, so that a summary of the test's failures
// (make test greps the lines a test logged) shows them.
func logNotable(t *testing.T, pid int, log string) {
	t.Helper()
	const most = 15
	var notable []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.Contains(line, `msg="partitions:`) || strings.HasPrefix(line, "panic") {
			notable = append(notable, strings.TrimSpace(line))
		}
	}
	for _, line := range notable[max(0, len(notable)-most):] {
		if len(line) > 400 {
			line = line[:400] + "…"
		}
		t.Logf("pid %d: %s", pid, line)
	}
}
