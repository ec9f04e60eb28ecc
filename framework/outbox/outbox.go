package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// ErrNoTx is returned by Add when ctx carries no transaction: outside a
// unit of work, pass the transaction to AddTx.
var ErrNoTx = errors.New("outbox: no transaction in the context (call Add inside a handler's attempt, or pass the transaction to AddTx)")

// ErrMissingDB is returned by New and NewRelay without a database.
var ErrMissingDB = errors.New("outbox: missing database (pass the *sqlx.DB of the handlers' writes, e.g. from sqlite.Open or postgres.Open)")

// Config configures an Outbox.
type Config struct {
	// TablePrefix prefixes the outbox table's name, as the migrations
	// were given it. Defaults to empty.
	TablePrefix string
	// Now is the clock of created_at. Defaults to time.Now.
	Now func() time.Time
	// MaxBodyBytes is the largest encoded event Add takes: an event its
	// consumers would dead-letter as too_large is refused instead.
	// Defaults to framework.DefaultMaxBodyBytes, the consumers' default
	// limit.
	MaxBodyBytes int
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = framework.DefaultMaxBodyBytes
	}
	return c
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	if err := sqlstore.ValidatePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("outbox: TablePrefix: %w", err)
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("outbox: MaxBodyBytes must not be negative, got %d", c.MaxBodyBytes)
	}
	return nil
}

// Outbox records events to publish in the transaction of the writes that
// caused them. A Relay publishes them once the transaction committed.
// It is safe for concurrent use.
type Outbox struct {
	db      *sqlx.DB
	sql     *sqlstore.Outbox
	now     func() time.Time
	maxBody int

	mu      sync.Mutex
	waiters map[chan struct{}]struct{}
}

// New returns the Outbox of db, a PostgreSQL or SQLite database migrated
// with the framework's migrations. The dialect comes from db.DriverName().
func New(db *sqlx.DB, cfg Config) (*Outbox, error) {
	if db == nil {
		return nil, ErrMissingDB
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := newSQL(db, cfg.TablePrefix)
	if err != nil {
		return nil, err
	}
	return &Outbox{db: db, sql: s, now: cfg.Now, maxBody: cfg.MaxBodyBytes, waiters: map[chan struct{}]struct{}{}}, nil
}

func newSQL(db *sqlx.DB, prefix string) (*sqlstore.Outbox, error) {
	d, err := sqlstore.DialectOf(db.DriverName())
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	s, err := sqlstore.NewOutbox(d, prefix)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return s, nil
}

// Add records envs in the transaction of the attempt running in ctx (see
// driver.TxFromContext): they are published after it commits, and never
// if it rolls back. Without a transaction in ctx it returns ErrNoTx.
//
// An envelope without a traceparent gets the trace context of the span
// in ctx, if any (see the package doc's Tracing): a handler's events refer
// to its consumer span, an endpoint's to its request's span.
//
// Each envelope must be valid (framework.Encode checks it). An event is
// recorded once: adding an event whose source and id the outbox already
// holds, in this transaction or an earlier one, is a no-op. A handler
// retried after a rollback adds its events again in the new transaction.
func (o *Outbox) Add(ctx context.Context, envs ...framework.Envelope) error {
	attempt, ok := driver.TxFromContext(ctx)
	if !ok {
		return ErrNoTx
	}
	if err := o.add(ctx, attempt, envs); err != nil {
		return err
	}
	if len(envs) > 0 {
		attempt.OnCommit(o.wake) // the relay sees the rows once they commit
	}
	return nil
}

// AddTx records envs in tx, a transaction of the Outbox's database that
// the caller commits. See Add.
func (o *Outbox) AddTx(ctx context.Context, tx *sqlx.Tx, envs ...framework.Envelope) error {
	if tx == nil {
		return ErrNoTx
	}
	if err := o.add(ctx, tx, envs); err != nil {
		return err
	}
	if len(envs) > 0 {
		o.wake() // the relay polls again soon: it cannot see the commit
	}
	return nil
}

func (o *Outbox) add(ctx context.Context, tx sqlx.ExecerContext, envs []framework.Envelope) error {
	stamped := make([]framework.Envelope, len(envs)) // the caller's stay as they are
	bodies := make([][]byte, len(envs))
	for i, env := range envs {
		stamped[i] = withTraceContext(ctx, env)
		// The row keeps the source as Encode writes it and consumers key
		// it, so that two spellings of it are one row, not two.
		stamped[i].Source = framework.NormalizeSource(env.Source)
		body, err := framework.Encode(stamped[i])
		if err == nil {
			err = driver.CheckBodySize(body, o.maxBody) // what its consumers would dead-letter
		}
		if err != nil {
			return fmt.Errorf("outbox: add %q: %w", env.Key().String(), err)
		}
		bodies[i] = body
	}
	at := o.now()
	for i, env := range stamped {
		if err := o.sql.Insert(ctx, tx, env, bodies[i], at); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
	}
	return nil
}

// subscribe returns a channel that receives a value (coalesced) after each
// Add, and a function that stops it.
func (o *Outbox) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	o.mu.Lock()
	o.waiters[ch] = struct{}{}
	o.mu.Unlock()
	return ch, func() {
		o.mu.Lock()
		delete(o.waiters, ch)
		o.mu.Unlock()
	}
}

func (o *Outbox) wake() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for ch := range o.waiters {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
