package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// StoreConfig configures a Store.
type StoreConfig struct {
	// TablePrefix prefixes the name of every table the store uses; it
	// must match the prefix the database was migrated with (see
	// framework/migrate). Defaults to none.
	TablePrefix string
	// Now is the store's clock. Defaults to time.Now.
	Now func() time.Time
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c StoreConfig) WithDefaults() StoreConfig {
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first invalid field of c.
func (c StoreConfig) Validate() error {
	if err := sqlstore.ValidatePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("postgres: TablePrefix: %w", err)
	}
	return nil
}

// ErrMissingDB is returned by NewStore without a database.
var ErrMissingDB = errors.New("postgres: missing database (try postgres.Open)")

// Store keeps processed marks, delivery counts and dead letters in a
// PostgreSQL database migrated by framework/migrate. It implements
// framework.ProcessedStore, framework.DeliveryStore and
// framework.DeadLetterStore.
//
// Mark and Forget run in the attempt's transaction, so the unit of work
// must be given the same database. When two transactions mark the same
// key, the second waits for the first (INSERT ... ON CONFLICT DO NOTHING):
// it finds a duplicate when the first commits and takes the mark when the
// first rolls back. Times are timestamptz, written in UTC, with
// PostgreSQL's microsecond precision.
type Store struct {
	s *sqlstore.Store
}

var (
	_ framework.ProcessedStore  = (*Store)(nil)
	_ framework.DeliveryStore   = (*Store)(nil)
	_ framework.DeadLetterStore = (*Store)(nil)
	_ framework.CheckpointStore = (*Store)(nil)
	_ framework.RenameStore     = (*Store)(nil)
	_ framework.PurgeStore      = (*Store)(nil)
	_ framework.OrderStore      = (*Store)(nil)
)

// NewStore returns a Store on db, which should come from Open.
func NewStore(db *sqlx.DB, cfg StoreConfig) (*Store, error) {
	if db == nil {
		return nil, ErrMissingDB
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := sqlstore.New(db, sqlstore.Postgres, cfg.TablePrefix, cfg.Now)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return &Store{s: s}, nil
}

// Mark records, inside tx, that consumer processed key; false means it
// was processed before. See framework.ProcessedStore.
func (s *Store) Mark(ctx context.Context, tx *framework.Tx, consumer string, key framework.Key) (bool, error) {
	return s.s.Mark(ctx, tx, consumer, key)
}

// Count records one more delivery of key to consumer, committed on its
// own, and returns the count; a new count starts at first. See
// framework.DeliveryStore.
func (s *Store) Count(ctx context.Context, consumer string, key framework.Key, first int) (int, error) {
	return s.s.Count(ctx, consumer, key, first)
}

// Forget removes the delivery count of key inside tx. See
// framework.DeliveryStore.
func (s *Store) Forget(ctx context.Context, tx *framework.Tx, consumer string, key framework.Key) error {
	return s.s.Forget(ctx, tx, consumer, key)
}

// PublishDeadLetter stores dl, or updates the dead letter of the same
// consumer and key: a repeat counts in Repeats, takes the latest code,
// attempts, message and LastFailedAt, keeps FirstFailedAt and is pending
// again, even when it had been replayed or discarded. The store stamps
// the times with its clock. It also forgets the message's delivery count
// for the consumer (see Count), in the same transaction, so that a replay
// is counted afresh instead of hitting the delivery limit at once.
func (s *Store) PublishDeadLetter(ctx context.Context, dl framework.DeadLetter) error {
	return s.s.PublishDeadLetter(ctx, dl)
}

// DeadLetter returns the dead letter with id, or an error wrapping
// framework.ErrNotFound.
func (s *Store) DeadLetter(ctx context.Context, id int64) (framework.DeadLetter, error) {
	return s.s.DeadLetter(ctx, id)
}

// DeadLetters lists the dead letters that match f, by ascending ID.
func (s *Store) DeadLetters(ctx context.Context, f framework.DeadLetterFilter) ([]framework.DeadLetter, error) {
	return s.s.DeadLetters(ctx, f)
}

// ResolveDeadLetter moves the pending dead letter id to r.Status
// (replayed or discarded) with who, why and when (zero r.At means now).
// It returns an error wrapping framework.ErrNotFound when no pending dead
// letter has id.
func (s *Store) ResolveDeadLetter(ctx context.Context, id int64, r framework.Resolution) error {
	return s.s.ResolveDeadLetter(ctx, id, r)
}

// Advance moves the checkpoint of (consumer, subject) to seq inside tx
// when seq is greater, and reports whether it moved. See
// framework.CheckpointStore.
func (s *Store) Advance(ctx context.Context, tx *framework.Tx, consumer, subject string, seq int64) (bool, error) {
	return s.s.Advance(ctx, tx, consumer, subject, seq)
}

// Adopt gives consumer the processed marks and subject checkpoints of
// from, the name it was renamed from. See framework.RenameStore.
func (s *Store) Adopt(ctx context.Context, consumer, from string) (int64, error) {
	return s.s.Adopt(ctx, consumer, from)
}

// PurgeProcessed deletes up to limit of the oldest marks processed before
// before. See framework.PurgeStore.
func (s *Store) PurgeProcessed(ctx context.Context, before time.Time, limit int) (int64, error) {
	return s.s.PurgeProcessed(ctx, before, limit)
}

// Checkpoint returns the sequence of (consumer, subject) that took effect
// last, 0 for none, and holds it for tx. See framework.OrderStore.
func (s *Store) Checkpoint(ctx context.Context, tx *framework.Tx, consumer, subject string) (int64, error) {
	return s.s.Checkpoint(ctx, tx, consumer, subject)
}

// WaitGap records that an event waits behind a gap and returns since when.
// See framework.OrderStore.
func (s *Store) WaitGap(ctx context.Context, consumer, subject string, seq int64, key framework.Key, body []byte) (time.Time, error) {
	return s.s.WaitGap(ctx, consumer, subject, seq, key, body)
}

// EndWait removes the wait of (consumer, subject, seq). See
// framework.OrderStore.
func (s *Store) EndWait(ctx context.Context, tx *framework.Tx, consumer, subject string, seq int64) error {
	return s.s.EndWait(ctx, tx, consumer, subject, seq)
}
