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

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
)

// The group-commit crash modes kill the process at one step of a batch:
// several attempts of the consumer sharing one transaction, each between
// a savepoint of its own (see framework.UnitOfWork).
const (
	// modeBatchMiddle kills the process inside an attempt, before its
	// handler, while earlier attempts of its batch have run (their
	// savepoints hold their effects) and later ones wait: the third of a
	// batch of four (the second of a batch of two or three).
	modeBatchMiddle = "batch-middle"
	// modeBatchBeforeCommit kills the process after the handler of the
	// last attempt of a full batch returned, before the batch commits.
	modeBatchBeforeCommit = "batch-before-commit"
	// modeBatchAfterCommit kills the process in an OnCommit hook of an
	// attempt that shares its batch: after the commit, before Do returns,
	// so before any attempt of the batch is acknowledged.
	modeBatchAfterCommit = "batch-after-commit"
)

// batchCrashFrom is the first attempt of the process (counted as they
// reach the Inner middleware) that may kill it: the ones before commit
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
	Attempt int64    `json:"attempt"` // of the process, counted at Inner
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

// mates returns the event ids of the attempts that ran before msg's in
// its batch.
func (p *batchProbe) mates(msg *message.Message) ([]string, error) {
	ctx := msg.Context()
	tx, ok := framework.TxFromContext(ctx)
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
	self := eventID(msg)
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

func eventID(msg *message.Message) string {
	d, _ := framework.EnvelopeFromContext(msg.Context())
	return d.ID
}

// batchHook returns the middleware of a group-commit crash mode. Each
// attempt from the batchCrashFrom-th on looks for its batch-mates; the
// first that finds what the mode needs kills the process, once per
// marker. A probe that fails ends the process with status 3.
func batchHook(mode, marker, url, consumer string, batchSize int) app.Middleware {
	probe := &batchProbe{url: url, consumer: consumer}
	var (
		attempts atomic.Int64
		returned sync.Map // event id -> true once its delivery left the unit of work
	)
	// fire reports the attempt's mates when it should kill the process.
	fire := func(msg *message.Message, n int64, want func(mates int) bool) ([]string, bool) {
		if n < batchCrashFrom || fired(marker) {
			return nil, false
		}
		mates, err := probe.mates(msg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "notifications: %v\n", err)
			os.Exit(3)
		}
		return mates, want(len(mates)) && firstTime(marker)
	}
	// crash reports and kills the process, after a grace that lets the
	// delivery of a mate handed back too early reach the transport's ack
	// (it ends as soon as one is seen).
	crash := func(id string, n int64, mates []string) {
		c := batchCrash{Mode: mode, Attempt: n, Event: id, Mates: mates}
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
	// outer runs once per delivery, around the retries and the unit of
	// work: next returns once the attempt's effect committed or rolled
	// back, and the message is acknowledged or nacked after it.
	outer := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			id := eventID(msg)
			out, err := next(msg)
			returned.Store(id, true)
			return out, err
		}
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
	inner := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			n, id := attempts.Add(1), eventID(msg)
			switch mode {
			case modeBatchMiddle:
				if mates, ok := fire(msg, n, middle); ok {
					crash(id, n, mates)
				}
			case modeBatchAfterCommit:
				if mates, ok := fire(msg, n, atLeastOne); ok {
					tx, _ := framework.TxFromContext(msg.Context()) // the probe found it
					tx.OnCommit(func() { crash(id, n, mates) })
				}
			case modeBatchBeforeCommit:
				out, err := next(msg)
				if err != nil {
					return out, err
				}
				if mates, ok := fire(msg, n, func(m int) bool { return m == batchSize-1 }); ok {
					crash(id, n, mates)
				}
				return out, nil
			}
			return next(msg)
		}
	}
	return app.Middleware{Outer: []message.HandlerMiddleware{outer}, Inner: []message.HandlerMiddleware{inner}}
}

// batchHookOf returns the hook of a group-commit mode, configured from
// the service's environment; ok is false for another mode.
func batchHookOf(mode, marker string) (mw app.Middleware, ok bool, err error) {
	switch mode {
	case modeBatchMiddle, modeBatchBeforeCommit, modeBatchAfterCommit:
	default:
		return app.Middleware{}, false, nil
	}
	size, err := strconv.Atoi(os.Getenv(envCrashBatchSize))
	if err != nil || size < 2 {
		return app.Middleware{}, true, fmt.Errorf("%s: want a batch size of 2 or more, got %q", envCrashBatchSize, os.Getenv(envCrashBatchSize))
	}
	consumer := cmp.Or(os.Getenv(envCrashConsumer), ConsumerName)
	return batchHook(mode, marker, os.Getenv(app.EnvDatabaseURL), consumer, size), true, nil
}
