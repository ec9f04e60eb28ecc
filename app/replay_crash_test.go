package app_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/testenv"
)

// envReplayCrashAt makes the test binary run, instead of the tests, a
// service whose replay relay kills its process with SIGKILL at the crash
// point it names.
const envReplayCrashAt = "EFFECTIVELY_TEST_REPLAY_CRASH_AT"

// TestReplayCrash kills a service's process with SIGKILL at a step of its
// replay relay, on SQLite and PostgreSQL: once the relay claimed a replay
// that the command committed, before anything is published; and between
// the replay's publication and its record as sent. After a restart the
// replay is published (not lost), and its effect happens once: in the
// second case the copy published again is a duplicate.
func TestReplayCrash(t *testing.T) {
	if at := os.Getenv(envReplayCrashAt); at != "" {
		runReplayCrashChild(t, crash.Point(at))
		return
	}
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config func(t *testing.T) app.Config
	}{{"SQLite", testConfig}, {"Postgres", postgresConfig}} {
		for _, at := range []crash.Point{crash.BeforeReplayPublish, crash.BeforeReplaySent} {
			t.Run(tc.name+"/"+string(at), func(t *testing.T) {
				t.Parallel()
				testReplayCrash(t, tc.config(t), at)
			})
		}
	}
}

func testReplayCrash(t *testing.T, cfg app.Config, at crash.Point) {
	var rejecting atomic.Bool
	rejecting.Store(true)
	name, picky := pickyConsumer("widgets.crash", &rejecting, true)

	// A dead letter, stored by a service that stops.
	first := &bundle{cfg: cfg}
	first.service = app.New(commandOptions(cfg, picky), fx.Populate(&first.transport))
	require.NoError(t, first.service.Err())
	startCtx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(t, first.service.Start(startCtx))
	db := openConfigured(t, cfg.DatabaseURL)
	b := &bundle{cfg: cfg, db: db}
	first.publishFrom(t, name, "w-1", "crash")
	var id int64
	waitFor(t, "the dead letter", func() bool {
		return db.Get(&id, db.Rebind(`SELECT id FROM dead_letters WHERE consumer = ?`), name) == nil
	})
	require.NoError(t, first.service.Stop(startCtx))

	// The replay, committed while no service runs.
	out, err := runCommand(t, commandOptions(cfg, picky), "dead-letters", "replay", fmt.Sprint(id), "--by", "tester", "--reason", "fixed")
	require.NoError(t, err)
	require.Contains(t, out, fmt.Sprintf("dead letter %d replayed\n", id))
	count := func(query string, args ...any) int { return b.count(t, db.Rebind(query), args...) }
	unsent := func() int { return count(`SELECT count(*) FROM replays WHERE sent_at IS NULL`) }
	require.Equal(t, 1, unsent())

	// A service whose relay dies at the point; it does not run the
	// consumer, so the copy published before the death waits for the
	// next one.
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestReplayCrash$", "-test.count=1")
	cmd.Env = append(os.Environ(), envReplayCrashAt+"="+string(at),
		app.EnvTransport+"="+cfg.Transport, app.EnvDatabaseURL+"="+cfg.DatabaseURL, app.EnvTransportURL+"="+cfg.TransportURL,
		app.EnvTablePrefix+"=", app.EnvAutoMigrate+"=true", app.EnvHTTPAddr+"=", app.EnvConfig+"=")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	err = testenv.RunChild(cmd) // killed with the test process, see StartChild
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "want the service killed by SIGKILL, got %v:\n%s", err, &logs)
	require.Equal(t, 1, unsent(), "the death left the replay unsent")
	require.Zero(t, count(`SELECT count(*) FROM widgets WHERE name = 'picky:crash'`))

	// Restarted, with the consumer: the replay is published again once
	// its claim's lease ends.
	rejecting.Store(false)
	b = setup(t, cfg, picky)
	duplicates := func() int { return outcomes(t, b, name, framework.Duplicate) }
	wantDuplicates := 0
	if at == crash.BeforeReplaySent {
		wantDuplicates = 1 // the copy published before the death, or the one after it
	}
	waitFor(t, "the replay applied", func() bool {
		return count(`SELECT count(*) FROM widgets WHERE name = 'picky:crash'`) == 1 && unsent() == 0 && duplicates() == wantDuplicates
	})
	require.Equal(t, 1, count(`SELECT count(*) FROM widgets WHERE name = 'picky:crash'`), "the effect happened once")
	require.Equal(t, 1, count(`SELECT count(*) FROM processed_events WHERE consumer = ?`, name))
	require.Equal(t, 1, count(`SELECT count(*) FROM replays`), "one replay, published again after the death")
	store := testStore(t, db)
	dl, err := store.DeadLetter(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, driver.DeadLetterReplayed, dl.Status)
	require.Equal(t, []driver.HistoryKind{driver.HistoryFailed, driver.HistoryReplayed}, historyKinds(t, store, id))
}

// runReplayCrashChild runs the service of the environment, with the
// widget consumer alone, until its replay relay passes point at, where it
// kills its own process.
func runReplayCrashChild(t *testing.T, at crash.Point) {
	cfg, err := app.LoadConfig(os.LookupEnv)
	require.NoError(t, err)
	die := func(_ context.Context, p crash.Point) bool {
		if p == at {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal comes
		}
		return false
	}
	setup(t, cfg, app.ReplayCrash(die))
	time.Sleep(waitLimit)
	t.Fatalf("the replay relay never reached %s", at)
}
