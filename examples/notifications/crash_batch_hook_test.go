package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
)

// The group-commit crash modes kill the process at one step of a batch:
// several attempts of the consumer sharing one transaction, each between
// a savepoint and its release (see framework.UnitOfWork).
const (
	// modeBatchMiddle kills the process inside an attempt, before its
	// handler, while earlier attempts of its batch are released and not
	// committed.
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

// batchCrash is what a group-commit hook reports, in the file
// batchReportPath(marker), before it kills the process.
type batchCrash struct {
	Mode    string   `json:"mode"`
	Attempt int64    `json:"attempt"` // of the process, counted at Inner
	Event   string   `json:"event"`   // the attempt that killed it
	Mates   []string `json:"mates"`   // the attempts before it in its batch
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
// its transaction: the reminders its transaction sees and a connection of
// its own does not (written and released, not committed).
type batchProbe struct {
	url string // the service's database: a SQLite file or a PostgreSQL URL

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
	const query = `SELECT event_id FROM reminders`
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

// batchHook returns the Inner middleware of a group-commit crash mode.
// Each attempt from the batchCrashFrom-th on looks for its batch-mates;
// the first that finds what the mode needs kills the process, once per
// marker. A probe that fails ends the process with status 3.
func batchHook(mode, marker, url string, batchSize int) app.Middleware {
	probe := &batchProbe{url: url}
	var attempts atomic.Int64
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
	report := func(msg *message.Message, n int64, mates []string) batchCrash {
		return batchCrash{Mode: mode, Attempt: n, Event: eventID(msg), Mates: mates}
	}
	inner := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			n := attempts.Add(1)
			switch mode {
			case modeBatchMiddle:
				if mates, ok := fire(msg, n, func(m int) bool { return m >= 1 }); ok {
					report(msg, n, mates).write(marker)
					killSelf()
				}
			case modeBatchAfterCommit:
				if mates, ok := fire(msg, n, func(m int) bool { return m >= 1 }); ok {
					tx, _ := framework.TxFromContext(msg.Context()) // the probe found it
					tx.OnCommit(func() {
						report(msg, n, mates).write(marker)
						killSelf()
					})
				}
			case modeBatchBeforeCommit:
				out, err := next(msg)
				if err != nil {
					return out, err
				}
				if mates, ok := fire(msg, n, func(m int) bool { return m == batchSize-1 }); ok {
					report(msg, n, mates).write(marker)
					killSelf()
				}
				return out, nil
			}
			return next(msg)
		}
	}
	return app.Middleware{Inner: []message.HandlerMiddleware{inner}}
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
	return batchHook(mode, marker, os.Getenv(app.EnvDatabaseURL), size), true, nil
}
