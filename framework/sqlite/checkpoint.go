package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// DefaultCheckpointInterval is how often, at most, a file opened by Open
// has its write-ahead log checkpointed while the process writes to it.
const DefaultCheckpointInterval = 100 * time.Millisecond

// restartFrames is the length of the write-ahead log, in frames (pages),
// past which a checkpoint holds the write gate so that it completes and
// the next writer starts the log from its beginning again.
const restartFrames = 8000

// checkpointer copies a file's write-ahead log back into the database
// (a PASSIVE checkpoint) on a connection of its own, outside the write
// gate, after the process wrote, at most once per interval.
//
// SQLite checkpoints in the connection whose commit brought the log to
// 1,000 pages, before that commit returns, and a checkpoint syncs the log
// and the database file: the committing writer still holds the write gate
// then, so every other writer of the process waited out the two fsyncs.
// Open turns that off on its connections (wal_autocheckpoint(0)) and
// checkpoints here instead. A PASSIVE checkpoint waits for no reader or
// writer: writers go on while it copies.
//
// The log starts again from its beginning only when a writer begins after
// a checkpoint copied all of it; under a steady stream of writes a
// checkpoint beside them never does, and the log would grow without end.
// So once it holds restartFrames, a checkpoint right after the one beside
// the writers holds the gate: it has only the last frames to copy, and the
// next writer of the process starts the log again (unless a reader still
// reads its end, or another process writes: then at a later one).
type checkpointer struct {
	open     func() (driver.Conn, error) // the connection of the checkpoints
	gate     *writeGate
	interval time.Duration
	restart  int64 // restartFrames, or less in tests

	rounds atomic.Int64    // checkpoints made (ended, whatever the outcome), for the tests
	wrote  chan struct{}   // a write since the last checkpoint; buffered 1
	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	done   chan struct{}
}

// newCheckpointer starts the checkpoints of the file that open connects
// to; Close stops them.
func newCheckpointer(open func() (driver.Conn, error), gate *writeGate, interval time.Duration, restart int64) *checkpointer {
	c := &checkpointer{
		open:     open,
		gate:     gate,
		interval: interval,
		restart:  restart,
		wrote:    make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	go c.run()
	return c
}

// written says that the process wrote to the file. It never waits.
func (c *checkpointer) written() {
	select {
	case c.wrote <- struct{}{}:
	default:
	}
}

// Close stops the checkpoints and closes their connection. The last
// connection to the file that closes checkpoints what is left, as SQLite
// always does.
func (c *checkpointer) Close() error {
	c.cancel()
	<-c.done
	return nil
}

func (c *checkpointer) run() {
	defer close(c.done)
	var conn driver.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	timer := time.NewTimer(0)
	<-timer.C
	var last time.Time
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.wrote:
		}
		if wait := c.interval - time.Since(last); wait > 0 {
			timer.Reset(wait)
			select {
			case <-c.ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		}
		last = time.Now()
		if conn == nil {
			var err error
			if conn, err = c.open(); err != nil {
				conn = nil // tried again after the next write
				continue
			}
		}
		frames, err := checkpoint(conn)
		if err == nil && frames >= c.restart {
			err = c.gated(conn)
		}
		c.rounds.Add(1)
		if err != nil && !errors.Is(err, errCheckpointBusy) {
			// A connection that failed otherwise is replaced; the
			// checkpoint is made again after the next write.
			_ = conn.Close()
			conn = nil
		}
	}
}

// gated checkpoints on conn holding the write gate, waiting for it at most
// as long as a writer would, or until Close. It writes nothing to the
// file, so its end asks for no further checkpoint: a log that a reader
// keeps from starting again is tried again after the next write, not
// every interval of an idle process.
func (c *checkpointer) gated(conn driver.Conn) error {
	if err := c.gate.acquire(c.ctx); err != nil {
		return nil // a writer held the gate all along, or Close: next time
	}
	defer c.gate.unlock()
	_, err := checkpoint(conn)
	return err
}

// errCheckpointBusy is a checkpoint that found another running.
var errCheckpointBusy = errors.New("sqlite: another checkpoint is running")

// checkpoint runs a PASSIVE checkpoint on conn and returns the length of
// the log in frames.
func checkpoint(conn driver.Conn) (frames int64, err error) {
	q, ok := conn.(driver.QueryerContext)
	if !ok {
		return 0, fmt.Errorf("sqlite: checkpoint: driver connection %T cannot query", conn)
	}
	rows, err := q.QueryContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)", nil)
	if err != nil {
		return 0, fmt.Errorf("sqlite: checkpoint: %w", err)
	}
	defer rows.Close()
	// busy, frames in the log, frames checkpointed
	row := make([]driver.Value, len(rows.Columns()))
	if err := rows.Next(row); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("sqlite: checkpoint: %w", err)
	}
	if len(row) < 2 {
		return 0, nil
	}
	if busy, ok := row[0].(int64); ok && busy != 0 {
		return 0, errCheckpointBusy
	}
	frames, _ = row[1].(int64)
	return frames, nil
}
