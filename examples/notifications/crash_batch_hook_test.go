package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
)

// The group-commit crash modes kill the process at one crash point of a
// batch: several attempts of the consumer sharing one transaction, one
// after another (see driver.UnitOfWork).
const (
	// modeBatchMiddle kills the process at crash point AfterMark of an
	// attempt, before its handler, while earlier attempts of its batch
	// have run (the transaction holds their effects) and later ones wait:
	// the third of a batch of four (the second of a batch of two or
	// three).
	modeBatchMiddle = "batch-middle"
	// modeBatchBeforeCommit kills the process at crash point BeforeCommit
	// of the last attempt of a full batch: its handler returned, the
	// batch has not committed.
	modeBatchBeforeCommit = "batch-before-commit"
	// modeBatchAfterCommit kills the process at crash point AfterCommit
	// of an attempt that shares its batch: after the commit, before Do
	// returns, so before any attempt of the batch is acknowledged.
	modeBatchAfterCommit = "batch-after-commit"
)

// batchCrashFrom is the first attempt of the process (counted as they
// pass crash point AfterMark) that may kill it: the ones before commit
// normally, so that each crash finds earlier effects committed.
const batchCrashFrom = 5

// envCrashBatchSize tells the group-commit hooks the consumer's batch
// size: modeBatchBeforeCommit fires in the attempt that fills a batch.
const envCrashBatchSize = "EFFECTIVELY_CRASH_BATCH_SIZE"

// batchAckGrace is how long a group-commit hook waits before it kills
// the process: long enough for the ack of a message handed back before
// its batch committed (the bug these tests look for) to reach the
// transport, so that its effect is lost. It adds to each crash only: no
// healthy run waits for it otherwise.
const batchAckGrace = 300 * time.Millisecond

// batchCrash is what a group-commit hook reports, in the file
// batchReportPath(marker), before it kills the process.
type batchCrash struct {
	Mode    string   `json:"mode"`
	Attempt int64    `json:"attempt"` // of the process, counted at AfterMark
	Event   string   `json:"event"`   // the attempt that killed it
	Mates   []string `json:"mates"`   // the attempts before it in its batch
	// Returned are the attempts, of Event and Mates, whose delivery the
	// unit of work had handed back to the transport (to be acknowledged)
	// before the kill: none may be before its batch committed and ran its
	// OnCommit hooks.
	Returned []string `json:"returned"`
}

// batchReportPath names the report of the hook whose marker is marker.
func batchReportPath(marker string) string { return marker + ".json" }

func (c batchCrash) write(marker string) {
	raw, err := json.Marshal(c)
	if err == nil {
		err = os.WriteFile(batchReportPath(marker), raw, 0o600)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "notifications: crash report: %v\n", err)
		os.Exit(3)
	}
}

// batchProbe finds, inside an attempt, the attempts that ran before it in
// its transaction: the reminders that its transaction sees and a
// connection of its own does not (written, not committed). It reads the
// handler's reminders, not the framework's processed marks: a batch marks
// all its events in one statement before its first attempt runs.
type batchProbe struct {
	url      string // the service's database: a SQLite file or a PostgreSQL URL
	consumer string

	once sync.Once
	db   *sqlx.DB
	err  error
}

func (p *batchProbe) open() (*sqlx.DB, error) {
	p.once.Do(func() {
		ctx := context.Background()
		if strings.HasPrefix(p.url, "postgres://") {
			p.db, p.err = postgres.Open(ctx, p.url, postgres.OpenConfig{MaxOpenConns: 2})
		} else {
			p.db, p.err = sqlite.Open(ctx, p.url, sqlite.OpenConfig{MaxOpenConns: 2})
		}
	})
	return p.db, p.err
}

// mates returns the event ids of the attempts that ran before the one
// of ctx (at crash point AfterMark or BeforeCommit) in its batch.
func (p *batchProbe) mates(ctx context.Context) ([]string, error) {
	tx, ok := driver.TxFromContext(ctx)
	if !ok {
		return nil, errors.New("batch probe: the attempt has no transaction")
	}
	db, err := p.open()
	if err != nil {
		return nil, fmt.Errorf("batch probe: open: %w", err)
	}
	query := `SELECT event_id FROM reminders`
	var inside, outside []string
	if err := tx.SelectContext(ctx, &inside, query); err != nil {
		return nil, fmt.Errorf("batch probe: inside: %w", err)
	}
	if err := db.SelectContext(ctx, &outside, query); err != nil {
		return nil, fmt.Errorf("batch probe: outside: %w", err)
	}
	committed := make(map[string]bool, len(outside))
	for _, id := range outside {
		committed[id] = true
	}
	self := eventID(ctx)
	var mates []string
	for _, id := range inside {
		if !committed[id] && id != self {
			mates = append(mates, id)
		}
	}
	return mates, nil
}

// fired reports whether the hook of marker killed a process already.
func fired(marker string) bool {
	_, err := os.Stat(marker)
	return err == nil
}

// batchHook returns the crash hook of a group-commit crash mode. Each
// attempt from the batchCrashFrom-th on looks for its batch-mates; the
// first that finds what the mode needs kills the process, once per
// marker. A probe that fails ends the process with status 3.
func batchHook(mode, marker, url, consumer string, batchSize int) testkit.CrashHook {
	probe := &batchProbe{url: url, consumer: consumer}
	var (
		attempts atomic.Int64
		returned sync.Map // event id -> true once its delivery left the unit of work
		armed    sync.Map // event id -> its mates, to kill at AfterCommit
	)
	// fire reports the mates of the attempt of ctx when it should kill
	// the process.
	fire := func(ctx context.Context, want func(mates int) bool) ([]string, bool) {
		if attempts.Load() < batchCrashFrom || fired(marker) {
			return nil, false
		}
		mates, err := probe.mates(ctx)
		if err != nil {
			fmt.Fprintf(os.Stderr, "notifications: %v\n", err)
			os.Exit(3)
		}
		return mates, want(len(mates)) && firstTime(marker)
	}
	// crash reports and kills the process, after a grace that lets the
	// delivery of a mate handed back too early reach the transport's ack
	// (it ends as soon as one is seen).
	crash := func(id string, mates []string) {
		c := batchCrash{Mode: mode, Attempt: attempts.Load(), Event: id, Mates: mates}
		grace := time.Now().Add(batchAckGrace)
		for len(c.Returned) == 0 && time.Now().Before(grace) {
			time.Sleep(5 * time.Millisecond)
			for _, a := range append([]string{id}, mates...) {
				if _, ok := returned.Load(a); ok {
					c.Returned = append(c.Returned, a)
				}
			}
		}
		c.write(marker)
		killSelf()
	}
	atLeastOne := func(mates int) bool { return mates >= 1 }
	// middle holds in an attempt with attempts before and after it in its
	// batch, more than one before it when the batch has room: the first
	// of a batch is its runner, whose delivery cannot return before the
	// batch ends whatever the bug.
	middle := func(mates int) bool {
		if batchSize < 4 {
			return mates >= 1
		}
		return mates >= 2 && mates <= batchSize-2
	}
	return func(ctx context.Context, at testkit.CrashPoint) bool {
		id := eventID(ctx)
		switch at {
		case testkit.AfterMark:
			attempts.Add(1)
			if mode != modeBatchMiddle {
				return false
			}
			if mates, ok := fire(ctx, middle); ok {
				crash(id, mates)
			}
		case testkit.BeforeCommit:
			switch mode {
			case modeBatchBeforeCommit:
				if mates, ok := fire(ctx, func(m int) bool { return m == batchSize-1 }); ok {
					crash(id, mates)
				}
			case modeBatchAfterCommit:
				if mates, ok := fire(ctx, atLeastOne); ok {
					armed.Store(id, mates)
				}
			}
		case testkit.AfterCommit:
			if mates, ok := armed.Load(id); ok {
				crash(id, mates.([]string))
			}
		case testkit.BeforeAck:
			// The delivery left the unit of work: the transport
			// acknowledges it next.
			returned.Store(id, true)
		}
		return false
	}
}

// batchHookOf returns the hook of a group-commit mode, configured from
// the service's environment; ok is false for another mode.
func batchHookOf(mode, marker string) (hook testkit.CrashHook, ok bool, err error) {
	switch mode {
	case modeBatchMiddle, modeBatchBeforeCommit, modeBatchAfterCommit:
	default:
		return nil, false, nil
	}
	size, err := strconv.Atoi(os.Getenv(envCrashBatchSize))
	if err != nil || size < 2 {
		return nil, true, fmt.Errorf("%s: want a batch size of 2 or more, got %q", envCrashBatchSize, os.Getenv(envCrashBatchSize))
	}
	consumer := cmp.Or(os.Getenv(envCrashConsumer), ConsumerName)
	return batchHook(mode, marker, os.Getenv(app.EnvDatabaseURL), consumer, size), true, nil
}
