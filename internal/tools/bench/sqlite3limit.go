package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
)

// sqlite3Pragmas are the per-connection pragmas the framework sets on
// each connection it opens (sqlite.Open), which the sqlite3 program's
// script sets too, read from a connection the framework opened: so they
// follow the framework's. wal_autocheckpoint is not among them: the
// framework turns it off and checkpoints on a connection of its own
// every 100 ms, where the program, alone, checkpoints itself at SQLite's
// default of 1,000 pages.
var sqlite3Pragmas = []string{"journal_mode", "synchronous", "cache_size", "foreign_keys", "busy_timeout"}

// measureSQLite3Limit is the SQLite transport's machine limit: Debian's
// sqlite3 program (C, no Go, no driver, no transport) runs a script
// generated beforehand from the run's backlog on a file the example
// service's migrations made, on the same disk as the service's: the
// service's pragmas, then, per event, the framework's dedup mark into
// its processed_events table (with its primary key and index) and the
// example's business row into reminders when the mark was new
// (changes() = 1), rawBatch events per transaction. The figures are those
// of a drain: its effects' handled_at, the program's CPU time and peak
// RSS from its rusage; no latency phase (it has no consumer to send to).
func measureSQLite3Limit(ctx context.Context, env *Env) (Result, error) {
	bin, err := exec.LookPath("sqlite3")
	if err != nil {
		return Result{}, errors.New("the sqlite3 program is not installed (scripts/services.sh installs Debian's)")
	}
	s, err := newSQLiteService(ctx, env, "")
	if err != nil {
		return Result{}, err
	}
	msgs, distinct := env.Backlog()
	script := filepath.Join(env.Dir, "limit.sql")
	if err := writeSQLite3Script(ctx, s.db, script, msgs); err != nil {
		return Result{}, err
	}
	env.Logf("sqlite3 on %d messages (%d distinct events)", len(msgs), distinct)
	in, err := os.Open(script)
	if err != nil {
		return Result{}, fmt.Errorf("script: %w", err)
	}
	defer in.Close()
	cmd := exec.CommandContext(ctx, bin, s.file)
	cmd.Stdin = in
	cmd.Stdout = io.Discard // the journal_mode pragma's answer
	var stderr bytes.Buffer
	cmd.Stderr = &stderr

	c0, err := sampleCPU(os.Getpid())
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Result{}, fmt.Errorf("sqlite3: %w", err)
	}
	watch := watchProcesses(cmd.Process.Pid)
	err = cmd.Wait()
	elapsed := time.Since(start)
	groups := watch.finish()
	if err != nil {
		return Result{}, fmt.Errorf("sqlite3: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	c1, err := sampleCPU(os.Getpid())
	if err != nil {
		return Result{}, err
	}
	// The program's own time, from its rusage: the watch's last reading
	// of it is up to procWatchInterval before it exited.
	used := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	groups[groupConsumer] = uint64(used.Seconds() * clockTicks)
	cpu := cpuBetween(c0, c1, elapsed.Seconds(), groups)
	cpu.Consumer = used.Seconds() / elapsed.Seconds()
	cpu.Messages = len(msgs)

	effects := s.Effects()
	drained, err := effects.Read(ctx)
	if err != nil {
		return Result{}, err
	}
	startUp, steady := startUpSteady(drained, start)
	res := Result{
		Messages: len(msgs), Events: distinct, Drained: len(drained), Elapsed: span(drained),
		StartUp: startUp, Steady: steady, CPU: cpu,
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.PeakRSS = ru.Maxrss << 10 // KiB
	}
	if res.Effects, res.DistinctEffects, err = effects.Count(ctx); err != nil {
		return Result{}, err
	}
	return res, nil
}

// clockTicks is the kernel's clock ticks a second (USER_HZ), the unit of
// /proc/PID/stat's times.
const clockTicks = 100

// writeSQLite3Script writes the sqlite3 program's script for msgs to
// path: the pragmas of db's connections (sqlite3Pragmas), then the
// events' inserts, rawBatch to a transaction. The mark's table is the
// framework's, found in db (its name ends in processed_events, after the
// table prefix); the consumer's name is the example's.
func writeSQLite3Script(ctx context.Context, db *sqlx.DB, path string, msgs []Message) error {
	conn, err := db.Connx(ctx)
	if err != nil {
		return fmt.Errorf("script: %w", err)
	}
	defer conn.Close()
	var marks string
	if err := conn.QueryRowxContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%processed_events' ORDER BY length(name) LIMIT 1`).Scan(&marks); err != nil {
		return fmt.Errorf("script: the framework's processed_events table: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("script: %w", err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, ".bail on\n")
	for _, p := range sqlite3Pragmas {
		var v string
		if err := conn.QueryRowxContext(ctx, "PRAGMA "+p).Scan(&v); err != nil {
			_ = f.Close()
			return fmt.Errorf("script: PRAGMA %s: %w", p, err)
		}
		fmt.Fprintf(w, "PRAGMA %s = %s;\n", p, v)
	}
	now := time.Now().UnixNano()
	for i, m := range msgs {
		if i%rawBatch == 0 {
			fmt.Fprintf(w, "BEGIN IMMEDIATE;\n")
		}
		var ev cloudEvent
		if err := json.Unmarshal(m.Body, &ev); err != nil {
			_ = f.Close()
			return fmt.Errorf("script: decode %s: %w", m.ID, err)
		}
		fmt.Fprintf(w, "INSERT INTO %s (consumer, source, event_id, processed_at) VALUES (%s, %s, %s, %d) ON CONFLICT DO NOTHING;\n",
			marks, sqlQuote(serviceQueue), sqlQuote(ev.Source), sqlQuote(ev.ID), now)
		fmt.Fprintf(w, "INSERT INTO reminders (appointment_id, starts_at, event_id) SELECT %s, %s, %s WHERE changes() = 1;\n",
			sqlQuote(ev.Data.AppointmentID), sqlQuote(ev.Data.StartsAt.UTC().Format(time.RFC3339)), sqlQuote(ev.ID))
		if i%rawBatch == rawBatch-1 || i == len(msgs)-1 {
			fmt.Fprintf(w, "COMMIT;\n")
		}
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		return fmt.Errorf("script: %w", err)
	}
	return nil
}

// sqlQuote returns s as an SQL string literal.
func sqlQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
