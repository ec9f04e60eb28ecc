package sqlitedrivers

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// driverCase opens a file with a driver, with the framework's pragmas.
type driverCase struct {
	name string
	open func(path string) (*sql.DB, error)
}

// drivers are the drivers of this build (see doc.go).
var drivers []driverCase

// pragmas are the framework's for a file (framework/sqlite.Open), but
// wal_autocheckpoint: the framework checkpoints on a connection of its
// own, and here SQLite's automatic checkpoints run in the writer, as in
// the bench's limits.
var pragmas = []string{
	"PRAGMA busy_timeout = 5000",
	"PRAGMA journal_mode = WAL",
	"PRAGMA foreign_keys = 1",
	"PRAGMA synchronous = NORMAL",
	"PRAGMA cache_size = -512",
}

// schema is the framework's processed_events and the example service's
// reminders, as their SQLite migrations make them (copied: the module
// keeps the framework out of its build, as the framework keeps these
// drivers out of its own).
const schema = `CREATE TABLE processed_events (
    consumer     TEXT    NOT NULL,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, source, event_id)
) WITHOUT ROWID;
CREATE INDEX processed_events_processed_at_idx ON processed_events (processed_at);
CREATE TABLE reminders (
    appointment_id TEXT NOT NULL,
    starts_at      TEXT NOT NULL,
    event_id       TEXT NOT NULL
)`

const (
	qMark     = `INSERT INTO processed_events (consumer, source, event_id, processed_at) VALUES (?, ?, ?, ?) ON CONFLICT (consumer, source, event_id) DO NOTHING`
	qReminder = `INSERT INTO reminders (appointment_id, starts_at, event_id) VALUES (?, ?, ?)`
	// perTx is how many events a transaction writes.
	perTx = 100
)

// open opens a file of its own in dir with d, on one connection, with
// the pragmas and the schema.
func open(t testing.TB, d driverCase, dir string) *sql.DB {
	t.Helper()
	db, err := d.open(filepath.Join(dir, d.name+".db"))
	if err != nil {
		t.Fatalf("%s: open: %v", d.name, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	for _, p := range slices.Concat(pragmas, []string{schema}) {
		if _, err := db.Exec(p); err != nil {
			t.Fatalf("%s: %s: %v", d.name, p, err)
		}
	}
	return db
}

// writer writes events with prepared statements.
type writer struct {
	db              *sql.DB
	mark, reminder  *sql.Stmt
	written, repeat int
}

func newWriter(t testing.TB, db *sql.DB) *writer {
	t.Helper()
	w := &writer{db: db}
	var err error
	if w.mark, err = db.Prepare(qMark); err != nil {
		t.Fatal(err)
	}
	if w.reminder, err = db.Prepare(qReminder); err != nil {
		t.Fatal(err)
	}
	return w
}

// write writes the events first to first+n-1 (an event's id is its
// number; every tenth repeats the one before it, a duplicate), perTx to
// a transaction.
func (w *writer) write(ctx context.Context, first, n int) error {
	now := time.Now().UnixNano()
	for start := first; start < first+n; start += perTx {
		tx, err := w.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		mark, reminder := tx.StmtContext(ctx, w.mark), tx.StmtContext(ctx, w.reminder)
		for i := start; i < min(start+perTx, first+n); i++ {
			id := i
			if i%10 == 9 {
				id = i - 1
			}
			eventID := fmt.Sprintf("event-%012d", id)
			res, err := mark.ExecContext(ctx, "notifications", "https://booking.example/appointments", eventID, now)
			if err != nil {
				_ = tx.Rollback()
				return fmt.Errorf("mark: %w", err)
			}
			if n, err := res.RowsAffected(); err != nil {
				_ = tx.Rollback()
				return fmt.Errorf("mark: %w", err)
			} else if n == 0 {
				w.repeat++
				continue
			}
			if _, err := reminder.ExecContext(ctx, fmt.Sprintf("appt-%d", id), "2026-12-06T10:00:00Z", eventID); err != nil {
				_ = tx.Rollback()
				return fmt.Errorf("reminder: %w", err)
			}
			w.written++
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// TestDrivers: each driver writes an event's mark and row once, and a
// repeat's mark only.
func TestDrivers(t *testing.T) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			db := open(t, d, t.TempDir())
			w := newWriter(t, db)
			if err := w.write(t.Context(), 0, 1000); err != nil {
				t.Fatal(err)
			}
			if err := w.write(t.Context(), 0, 10); err != nil { // all repeats
				t.Fatal(err)
			}
			var marks, rows int
			if err := db.QueryRow(`SELECT (SELECT count(*) FROM processed_events), (SELECT count(*) FROM reminders)`).Scan(&marks, &rows); err != nil {
				t.Fatal(err)
			}
			if marks != 900 || rows != 900 || w.written != 900 || w.repeat != 110 {
				t.Fatalf("%d marks, %d rows, %d written, %d repeats; want 900, 900, 900, 110", marks, rows, w.written, w.repeat)
			}
			var mode string
			if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
				t.Fatalf("journal_mode %q (%v), want wal", mode, err)
			}
		})
	}
}

// BenchmarkDrivers writes b.N events with each driver of the build, and
// reports events/s.
func BenchmarkDrivers(b *testing.B) {
	for _, d := range drivers {
		b.Run(d.name, func(b *testing.B) {
			w := newWriter(b, open(b, d, b.TempDir()))
			b.ReportAllocs()
			b.ResetTimer()
			if err := w.write(b.Context(), 0, b.N); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
