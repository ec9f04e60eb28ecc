// Package purge is the one purge of a service's database, shared by the
// runner, which purges every interval, and the purge command, which
// purges once or counts what it would delete.
package purge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/bound"
)

const (
	// batch is how many rows one purge statement deletes, each batch in a
	// short transaction of its own.
	batch = 1000
	// leaseName names the lease that one process of the service holds
	// while it purges (driver.Purger.AcquireLease).
	leaseName = "purge"
	// LeaseTTL is how long the lease lasts unless renewed: a purger
	// renews it before each batch, and a purger that died frees it after
	// this long.
	LeaseTTL = 2 * time.Minute
	// releaseStopping bounds the release of the lease by a purge cut
	// short by the service's stop.
	releaseStopping = 250 * time.Millisecond
	// maxStatement is the most a purge statement's bound grows to (see
	// Purger.stmt): a batch slow on a loaded server is cut short at
	// first, and the next one waits longer.
	maxStatement = LeaseTTL / 4
)

// ErrBusy is returned by a purge while another process holds the purge's
// lease.
var ErrBusy = errors.New("another process of the service is purging (the lease \"purge\" is held): try again later")

// errCannot is returned when the store cannot purge.
var errCannot = errors.New("purge: the store cannot purge (it does not implement driver.Purger)")

// Retentions are how long each kind of row is kept.
type Retentions struct {
	// Processed is how long processed marks are kept; zero keeps them
	// forever.
	Processed time.Duration
	// Outbox, Replays and DeadLetters are how long sent outbox rows, sent
	// replays and resolved dead letters are kept.
	Outbox, Replays, DeadLetters time.Duration
	// Transport is how long the transport's messages every consumer group
	// passed are kept (see Purger.WithTopics).
	Transport time.Duration
}

// KindTransport is the kind of the steps that delete a topic's messages
// from the transport's tables (driver.TopicPurger).
const KindTransport driver.PurgeKind = "transport_messages"

// Purger purges a store: the delivery counts of messages that finished,
// the processed marks, sent outbox rows and replays, and resolved dead
// letters (with their history) past their retention. It deletes in
// batches, each in a transaction of its own that records the kind's purge
// horizon, and holds a lease meanwhile, so that one process of the
// service purges at a time.
type Purger struct {
	store  driver.Purger // nil when the store cannot purge
	ret    Retentions
	logger *slog.Logger
	holder string
	now    func() time.Time
	batch  int // rows a statement deletes
	// stmt bounds each call of the lease and of a batch (see bounded):
	// one whose request or answer the network lost would wait for ever,
	// its transaction open, and the purge with it (see internal/bound).
	stmt *bound.Statement

	transport driver.TopicPurger // nil when the transport keeps no tables of its own
	topics    []string
}

// New returns the purger of store with the retentions ret; it logs to
// logger.
func New(store driver.Store, ret Retentions, logger *slog.Logger) *Purger {
	p, _ := store.(driver.Purger)
	return &Purger{
		store:  p,
		ret:    ret,
		logger: logger,
		holder: holder(),
		now:    time.Now,
		batch:  batch,
		stmt:   bound.New(bound.First, maxStatement),
	}
}

// WithTopics makes the purge also delete, after the store's rows, the
// messages of topics in transport's tables that every consumer group
// passed longer than Retentions.Transport ago; a nil transport deletes
// none. It returns pu.
func (pu *Purger) WithTopics(transport driver.TopicPurger, topics []string) *Purger {
	pu.transport, pu.topics = transport, topics
	return pu
}

// Can reports whether the store can purge.
func (pu *Purger) Can() bool { return pu.store != nil }

// holder names this process as a lease's holder: host, pid and a random
// part, unique across processes and purgers.
func holder() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Step is what a purge deletes of one kind: the rows older than Before.
type Step struct {
	Kind driver.PurgeKind
	// Topic is the topic of a KindTransport step, whose rows are older
	// than Before by the database's clock (Before is this process's
	// reading of it, for the reports).
	Topic  string
	Before time.Time
	// Rows counts what was deleted, or with a dry run what would be.
	Rows int64
}

// Attrs are the log attributes of what a purge deleted: a count per kind
// that lost rows.
func Attrs(steps []Step) []any {
	var attrs []any
	for _, s := range steps {
		switch {
		case s.Rows > 0 && s.Topic != "":
			attrs = append(attrs, string(s.Kind)+":"+s.Topic, s.Rows)
		case s.Rows > 0:
			attrs = append(attrs, string(s.Kind), s.Rows)
		}
	}
	return attrs
}

// steps returns what a purge at now deletes, in order: the delivery
// counts first, while the marks that show their message finished exist.
// The counts first made before the processed-mark retention go too: a
// message still failing after that long is past any redelivery its mark
// would have caught.
func (pu *Purger) steps(now time.Time) []Step {
	var marks time.Time
	if pu.ret.Processed > 0 {
		marks = now.Add(-pu.ret.Processed)
	}
	steps := []Step{{Kind: driver.PurgeDeliveries, Before: marks}}
	if !marks.IsZero() {
		steps = append(steps, Step{Kind: driver.PurgeProcessed, Before: marks})
	}
	steps = append(steps,
		Step{Kind: driver.PurgeOutbox, Before: now.Add(-pu.ret.Outbox)},
		Step{Kind: driver.PurgeReplays, Before: now.Add(-pu.ret.Replays)},
		Step{Kind: driver.PurgeDeadLetters, Before: now.Add(-pu.ret.DeadLetters)},
	)
	if pu.transport != nil {
		for _, topic := range pu.topics {
			steps = append(steps, Step{Kind: KindTransport, Topic: topic, Before: now.Add(-pu.ret.Transport)})
		}
	}
	return steps
}

// deleteBatch deletes up to pu.batch rows of step.
func (pu *Purger) deleteBatch(ctx context.Context, step Step) (int64, error) {
	if step.Kind == KindTransport {
		n, err := pu.transport.PurgeTopicBatch(ctx, step.Topic, pu.ret.Transport, pu.batch)
		if err != nil {
			return n, fmt.Errorf("transport: %w", err)
		}
		return n, nil
	}
	return pu.store.PurgeBatch(ctx, step.Kind, step.Before, pu.batch)
}

// purgeable counts the rows of step.
func (pu *Purger) purgeable(ctx context.Context, step Step) (int64, error) {
	if step.Kind == KindTransport {
		n, err := pu.transport.PurgeableTopic(ctx, step.Topic, pu.ret.Transport)
		if err != nil {
			return n, fmt.Errorf("transport: %w", err)
		}
		return n, nil
	}
	return pu.store.Purgeable(ctx, step.Kind, step.Before)
}

// Purge takes the lease, deletes every step's rows in batches, renewing
// the lease before each, and releases it. It returns what it deleted,
// ErrBusy when another process holds the lease, and stops when it loses
// the lease or ctx ends.
func (pu *Purger) Purge(ctx context.Context) ([]Step, error) {
	if pu.store == nil {
		return nil, errCannot
	}
	defer func() {
		// Released even when ctx ended, and even when taking it failed:
		// an acquisition cut short by a stop may have committed all the
		// same, and the next purge need not wait for the lease's end.
		// Releasing a lease this purger does not hold changes nothing.
		// While the service stops it waits only briefly: behind an
		// attempt that holds the SQLite file's write lock, the release
		// took the 5 s from the stop that the attempt's drain needs, and
		// a lease not released ends by itself (LeaseTTL).
		timeout := 5 * time.Second
		if ctx.Err() != nil {
			timeout = releaseStopping
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		switch err := pu.store.ReleaseLease(rctx, leaseName, pu.holder); {
		case err != nil && ctx.Err() != nil:
			pu.logger.InfoContext(ctx, "purge: the lease was not released while stopping; it ends by itself", "error", err, "within", LeaseTTL)
		case err != nil:
			pu.logger.WarnContext(ctx, "purge: release the lease", "error", err)
		}
	}()
	if err := pu.lease(ctx); err != nil {
		return nil, err
	}
	steps := pu.steps(pu.now())
	for i := range steps {
		for {
			var n int64
			err := pu.bounded(ctx, func(ctx context.Context) (err error) {
				n, err = pu.deleteBatch(ctx, steps[i])
				return err
			})
			steps[i].Rows += n
			if err != nil {
				return steps, fmt.Errorf("purge: %w", err)
			}
			if n < int64(pu.batch) {
				break
			}
			if err := pu.lease(ctx); err != nil {
				return steps, err
			}
		}
	}
	return steps, nil
}

// bounded runs f, a call of the store, under the purge's statement bound
// (Purger.stmt). A call cut short by the bound runs again under the bound
// it doubled, until the bound is at its most: a request or answer the
// network lost costs one bound, and a batch slow on a loaded server gets
// longer each time, instead of failing the purge. A batch cut short
// rolled back, or committed unseen; either way the next one deletes what
// is left.
func (pu *Purger) bounded(ctx context.Context, f func(context.Context) error) error {
	for {
		before := pu.stmt.Current()
		err := pu.stmt.Run(ctx, f)
		if err == nil || ctx.Err() != nil || pu.stmt.Current() == before {
			return err
		}
	}
}

// lease takes or renews the purge's lease: ErrBusy when another process
// holds it.
func (pu *Purger) lease(ctx context.Context) error {
	var ok bool
	err := pu.bounded(ctx, func(ctx context.Context) (err error) {
		ok, err = pu.store.AcquireLease(ctx, leaseName, pu.holder, LeaseTTL)
		return err
	})
	switch {
	case err != nil:
		return fmt.Errorf("purge: %w", err)
	case !ok:
		return ErrBusy
	}
	return nil
}

// DryRun counts what Purge would delete now, deleting nothing.
func (pu *Purger) DryRun(ctx context.Context) ([]Step, error) {
	if pu.store == nil {
		return nil, errCannot
	}
	steps := pu.steps(pu.now())
	for i := range steps {
		n, err := pu.purgeable(ctx, steps[i])
		if err != nil {
			return steps, fmt.Errorf("purge: %w", err)
		}
		steps[i].Rows = n
	}
	return steps, nil
}
