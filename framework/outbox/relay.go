package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/sqlstore"
	"github.com/effectively-once/effectively/internal/bound"
)

// Defaults of RelayConfig.
const (
	// DefaultPollInterval is how often a relay looks for unsent rows when
	// nothing wakes it.
	DefaultPollInterval = time.Second
	// DefaultBatchSize is how many rows a relay publishes per transaction.
	DefaultBatchSize = 1000
	// DefaultBatchBytes is how many bytes of events one batch holds at
	// most (see RelayConfig.BatchBytes): 16 MiB.
	DefaultBatchBytes = 16 << 20
	// DefaultBatchTimeout bounds the publishing of one batch (see
	// RelayConfig.BatchTimeout).
	DefaultBatchTimeout = 30 * time.Second
	// MaxBatchTimeout is the longest BatchTimeout: a batch's deadline and
	// its lease on SQLite are twice it, and its claim's idle bound on
	// PostgreSQL twice it and 2 s, all of which a timeout of centuries
	// would overflow (the relay then published nothing).
	MaxBatchTimeout = 24 * time.Hour
	// DefaultRetention is how long sent rows are kept before cleanup.
	DefaultRetention = 24 * time.Hour
	// DefaultCleanupInterval is how often a relay deletes old sent rows.
	DefaultCleanupInterval = 10 * time.Minute
	// DefaultCleanupBatchSize is how many rows one delete statement removes.
	DefaultCleanupBatchSize = 1000
)

// wakeDelay is the first delay of the quick polls that follow an Add in
// this process: the Add's transaction commits soon after, and is looked
// for after 5, 10, 20... milliseconds, up to the poll interval.
const wakeDelay = 5 * time.Millisecond

// ErrRunning is returned by Run while the relay runs already.
var ErrRunning = errors.New("outbox: the relay is running already")

// ErrMissingPublisher is returned by NewRelay without a publisher.
var ErrMissingPublisher = errors.New("outbox: missing publisher (pass the transport's publisher, e.g. driver.Transport.Publisher)")

// RelayConfig configures a Relay.
type RelayConfig struct {
	// TablePrefix prefixes the outbox table's name, as the migrations
	// were given it. Defaults to empty.
	TablePrefix string
	// Outbox, when set, wakes the relay after each of its Adds in this
	// process, so that events are published soon after their transaction
	// commits instead of at the next poll. Defaults to nil.
	Outbox *Outbox
	// Metrics, when set, counts what the relay publishes and fails to, and
	// tracks the age of the oldest unsent row. Defaults to nil.
	Metrics *Metrics
	// PollInterval is how often the relay looks for unsent rows. Defaults
	// to DefaultPollInterval.
	PollInterval time.Duration
	// BatchSize is how many rows one batch publishes. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// BatchBytes bounds the memory of a batch: a batch reads rows in id
	// order while their encoded events come to at most BatchBytes, and
	// always its first row, whatever its size. With a DeferredPublisher
	// two batches are on their way at once. Defaults to
	// DefaultBatchBytes.
	BatchBytes int
	// BatchTimeout bounds the publishing of one batch: no row of it is
	// published once it passed (the rest goes out in the next batch),
	// and the confirms and marks of the rows published by then get as
	// long again; a row left unmarked is published again. On SQLite a
	// batch leases its rows for twice BatchTimeout; on PostgreSQL the
	// server ends a batch's transaction that waits idle for twice
	// BatchTimeout and 2 s (a relay frozen or cut off from it). At most
	// MaxBatchTimeout. Defaults to DefaultBatchTimeout.
	BatchTimeout time.Duration
	// Retention is how long sent rows are kept; a negative value keeps
	// them forever. Defaults to DefaultRetention.
	Retention time.Duration
	// CleanupInterval is how often the relay deletes rows sent longer than
	// Retention ago. Defaults to DefaultCleanupInterval.
	CleanupInterval time.Duration
	// CleanupBatchSize is how many rows one delete statement removes.
	// Defaults to DefaultCleanupBatchSize.
	CleanupBatchSize int
	// Logger logs failed batches and cleanups. Defaults to discarding.
	Logger *slog.Logger
	// Tracer starts a producer span per publish, a child of the event's
	// trace context (its traceparent, see Outbox.Add). Defaults to a no-op
	// tracer.
	Tracer trace.Tracer
	// MessagingSystem is the publish spans' messaging.system attribute,
	// the transport's broker as OpenTelemetry names it (rabbitmq). Defaults
	// to empty: no attribute.
	MessagingSystem string
	// Now is the clock of sent_at and of the retention. Defaults to
	// time.Now.
	Now func() time.Time
	// DropUnroutable lists the event types whose rows may be dropped when
	// the broker routes them nowhere (driver.ErrUnroutable: on RabbitMQ,
	// no queue bound to the type's exchange): such a row is marked sent
	// and counted (effectively_outbox_unroutable_dropped_total). The rows
	// of any other type wait unsent instead, tried again at each poll,
	// while the rows of other types go out. Defaults to none.
	DropUnroutable []string
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c RelayConfig) WithDefaults() RelayConfig {
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.BatchBytes = cmp.Or(c.BatchBytes, DefaultBatchBytes)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, DefaultBatchTimeout)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, DefaultCleanupInterval)
	c.CleanupBatchSize = cmp.Or(c.CleanupBatchSize, DefaultCleanupBatchSize)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Tracer == nil {
		c.Tracer = noop.NewTracerProvider().Tracer("")
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first invalid field of c.
func (c RelayConfig) Validate() error {
	if err := sqlstore.ValidatePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("outbox: TablePrefix: %w", err)
	}
	switch {
	case c.PollInterval < 0:
		return fmt.Errorf("outbox: PollInterval must be positive, got %s", c.PollInterval)
	case c.BatchSize < 1:
		return fmt.Errorf("outbox: BatchSize must be at least 1, got %d", c.BatchSize)
	case c.BatchBytes < 1:
		return fmt.Errorf("outbox: BatchBytes must be at least 1, got %d", c.BatchBytes)
	case c.BatchTimeout < 0:
		return fmt.Errorf("outbox: BatchTimeout must be positive, got %s", c.BatchTimeout)
	case c.BatchTimeout > MaxBatchTimeout:
		return fmt.Errorf("outbox: BatchTimeout must be at most %s, got %s", MaxBatchTimeout, c.BatchTimeout)
	case c.CleanupInterval < 0:
		return fmt.Errorf("outbox: CleanupInterval must be positive, got %s", c.CleanupInterval)
	case c.CleanupBatchSize < 1:
		return fmt.Errorf("outbox: CleanupBatchSize must be at least 1, got %d", c.CleanupBatchSize)
	}
	return nil
}

// DeferredPublisher is a publisher that publishes a message without
// waiting for the broker's confirm: PublishDeferred returns once the
// message is on its way, and its wait returns nil once the broker confirmed
// it, or an error when it did not (a nack, a lost connection) or ctx
// ended. Messages published one after another by one goroutine travel in
// that order. The AMQP transport's publisher is one (publisher confirms on
// a channel of its own).
//
// When its publisher is a DeferredPublisher, a relay publishes a batch's
// rows without waiting for each confirm, and marks each row sent once its
// own confirm arrived, many rows a statement. Otherwise it publishes one
// row at a time, each when Publish returned for the one before.
type DeferredPublisher interface {
	PublishDeferred(ctx context.Context, topic string, msg *message.Message) (wait func(context.Context) error, err error)
}

// Relay publishes the outbox's unsent rows, oldest first, and marks them
// sent. Delivery is at least once: a relay that stops between publishing
// a row and marking it publishes the row again when it restarts, so
// consumers must deduplicate (the framework's consumers do).
//
// Several relays may run on one database, in one process or several, and
// share the rows without publishing one twice while they are healthy. On
// PostgreSQL each batch locks its rows (FOR UPDATE SKIP LOCKED) in a
// transaction held while it publishes. On SQLite a batch cannot hold the
// write lock while it publishes (the SQLite transport writes to the same
// file), so it takes a lease on its rows in one short write instead; the
// rows of a relay that dies go to another once the lease (twice
// BatchTimeout) ends.
//
// Rows are published in id order within one relay; a row published
// again (its publish or confirm failed) comes after rows behind it that
// went out meanwhile. Several relays, and transactions that commit out of
// id order, publish in no guaranteed order, as the framework's delivery
// promises none.
type Relay struct {
	db       *sqlx.DB
	pub      message.Publisher
	deferred DeferredPublisher // pub, when it is one
	sql      *sqlstore.Outbox
	horizons *sqlstore.Horizons
	cfg      RelayConfig
	running  atomic.Bool

	unroutable *unroutable
	// bound bounds each statement of a batch's transaction on
	// PostgreSQL, bound.First at first, up to the batch's own bound: one
	// whose request or answer was lost on its way (a proxy or middlebox
	// that dropped it, the connection still open) is given up that soon,
	// and its batch with it, instead of holding the relay, and the rows
	// it locked, for twice the batch's timeout.
	bound *bound.Statement
}

// NewRelay returns a relay of db's outbox that publishes through pub to
// the topic named by each event's type.
func NewRelay(db *sqlx.DB, pub message.Publisher, cfg RelayConfig) (*Relay, error) {
	if db == nil {
		return nil, ErrMissingDB
	}
	if pub == nil {
		return nil, ErrMissingPublisher
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := newSQL(db, cfg.TablePrefix)
	if err != nil {
		return nil, err
	}
	if cfg.Outbox != nil && cfg.Outbox.db != db {
		return nil, errors.New("outbox: RelayConfig.Outbox is an outbox of another database")
	}
	horizons, err := sqlstore.NewHorizons(s.Dialect(), cfg.TablePrefix)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	deferred, _ := pub.(DeferredPublisher)
	return &Relay{
		db: db, pub: pub, deferred: deferred, sql: s, horizons: horizons, cfg: cfg,
		unroutable: newUnroutable(cfg.DropUnroutable, cfg.Metrics, cfg.Logger),
		bound:      bound.New(bound.First, 2*cfg.BatchTimeout),
	}, nil
}

// Run publishes unsent rows until ctx ends, then returns nil. It polls
// every PollInterval, sooner after an Add of RelayConfig.Outbox, and
// deletes old sent rows every CleanupInterval. A failed batch is logged
// and tried again at the next poll.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	var wake <-chan struct{}
	if r.cfg.Outbox != nil {
		ch, stop := r.cfg.Outbox.subscribe()
		defer stop()
		wake = ch
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	soon := r.cfg.PollInterval // the next quick poll's delay after a wake
	nextCleanup := r.cfg.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			soon = wakeDelay
		case <-timer.C:
		}
		n, err := r.PublishUnsent(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if m := r.cfg.Metrics; m != nil {
			r.observe(ctx, m, n, err)
		}
		r.reportUnroutable(ctx)
		delay := r.cfg.PollInterval
		switch {
		case err != nil:
			r.cfg.Logger.ErrorContext(ctx, "outbox relay: publish failed; trying again at the next poll", "error", err, "published", n)
		case n == 0 && soon < r.cfg.PollInterval:
			delay, soon = soon, soon*2
		default:
			soon = r.cfg.PollInterval
		}
		if r.cfg.Retention >= 0 && !r.cfg.Now().Before(nextCleanup) {
			nextCleanup = r.cfg.Now().Add(r.cfg.CleanupInterval)
			if _, err := r.Cleanup(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.ErrorContext(ctx, "outbox relay: cleanup failed", "error", err)
			}
		}
		timer.Reset(delay)
	}
}

// observe records a poll's result and the age of the oldest unsent row.
func (r *Relay) observe(ctx context.Context, m *Metrics, published int, err error) {
	m.published.Add(float64(published))
	if err != nil {
		m.failures.Inc()
	}
	oldest, qerr := r.sql.Unsent(ctx, r.db, 1)
	switch {
	case qerr != nil:
		r.cfg.Logger.ErrorContext(ctx, "outbox relay: read the oldest unsent row", "error", qerr)
	case len(oldest) == 0:
		m.oldest.Set(0)
	default:
		m.oldest.Set(max(r.cfg.Now().Sub(oldest[0].CreatedAt).Seconds(), 0))
	}
}

// PublishUnsent publishes unsent rows in batches until a batch comes back
// short (fewer than BatchSize rows, and not for BatchBytes), and returns
// how many rows it published. It stops at the first row it cannot
// publish, after marking the rows before it sent.
//
// With a DeferredPublisher, a batch's confirms and marks finish while the
// next batch is read and published: at most two batches are on their way
// at once (on PostgreSQL, two transactions), and it stops after the batch
// in which a row failed and the one behind it. On PostgreSQL a batch cut
// short by BatchBytes finishes before the next one is read: it holds the
// locks of the rows it left, which the next batch would skip, publishing
// later rows first.
//
// A row that the broker routes nowhere (driver.ErrUnroutable) is no
// failure: it stays unsent, and the next batches leave out the rows of
// its type, while the rest go out; each call tries again the oldest row
// of each such type in its first batch (RelayConfig.DropUnroutable
// drops them instead). Dropped rows are not counted as published.
func (r *Relay) PublishUnsent(ctx context.Context) (int, error) {
	total := 0
	var finishing chan batchResult // the batch before, finishing
	wait := func() error {
		if finishing == nil {
			return nil
		}
		res := <-finishing
		finishing = nil
		total += res.published
		return res.err
	}
	for first := true; ctx.Err() == nil; first = false {
		b, err := r.startBatch(ctx, r.unroutable.skip(first))
		if err != nil {
			return total, errors.Join(wait(), err)
		}
		if r.deferred == nil || b.holds {
			if err := wait(); err != nil {
				n, ferr := b.finish()
				return total + n, errors.Join(err, ferr)
			}
			n, err := b.finish()
			total += n
			if err != nil {
				return total, err
			}
		} else {
			if err := wait(); err != nil {
				n, ferr := b.finish()
				return total + n, errors.Join(err, ferr)
			}
			finishing = make(chan batchResult, 1)
			go func(done chan<- batchResult) {
				n, err := b.finish()
				done <- batchResult{n, err}
			}(finishing)
		}
		if !b.more {
			break
		}
	}
	return total, wait()
}

// Cleanup deletes the rows sent longer than Retention ago, in batches of
// CleanupBatchSize, and returns how many it deleted. With a negative
// Retention it deletes nothing. A batch that deletes rows records, in its
// transaction, that rows sent before that time may be gone (the outbox's
// purge horizon, driver.PurgeOutbox), which an operator's view of an
// event reports.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	if r.cfg.Retention < 0 {
		return 0, nil
	}
	before := r.cfg.Now().Add(-r.cfg.Retention)
	var total int64
	for {
		n, err := r.cleanupBatch(ctx, before)
		total += n
		if err != nil {
			return total, fmt.Errorf("outbox: %w", err)
		}
		if n < int64(r.cfg.CleanupBatchSize) {
			return total, nil
		}
	}
}

// cleanupBatch deletes one batch of rows sent before before and records
// the purge horizon with them, in one transaction.
func (r *Relay) cleanupBatch(ctx context.Context, before time.Time) (int64, error) {
	tx, err := r.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("delete sent outbox rows: begin: %w", err)
	}
	defer tx.Rollback() // a no-op after Commit
	n, err := r.sql.Cleanup(ctx, tx, before, r.cfg.CleanupBatchSize)
	if err != nil {
		return 0, err
	}
	if n > 0 {
		if err := r.horizons.Record(ctx, tx, driver.PurgeOutbox, before); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("delete sent outbox rows: commit: %w", err)
	}
	return n, nil
}
