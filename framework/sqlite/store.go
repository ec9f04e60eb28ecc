package sqlite

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
	// OnResolve, when set, is called after each ResolveDeadLetter that
	// committed, with the dead letter as it was and its resolution: a
	// service counts its replays and discards with it. Defaults to nil.
	OnResolve func(dl framework.DeadLetter, r framework.Resolution)
}

// ErrMissingDB is returned by NewStore without a database.
var ErrMissingDB = errors.New("sqlite: missing database (try sqlite.Open)")

// Store keeps processed marks, delivery counts, dead letters, subject
// checkpoints and waits in a SQLite database migrated by
// framework/migrate. It implements every store interface of package
// framework.
//
// Times are stored as INTEGER nanoseconds since the Unix epoch, in UTC.
// Mark and Forget run in the attempt's transaction, so the unit of work
// must be given the same database. Open begins transactions with BEGIN
// IMMEDIATE, so an attempt holds the file's write lock from its start and
// attempts on one file run one at a time: Mark never races another mark.
//
// Its methods run the framework's one SQL implementation, shared with the
// other database; each names the framework interface it implements.
type Store struct {
	sql *sqlstore.Store
}

var _ framework.Store = (*Store)(nil)

// NewStore returns a Store on db, which should come from Open.
func NewStore(db *sqlx.DB, cfg StoreConfig) (*Store, error) {
	if db == nil {
		return nil, ErrMissingDB
	}
	s, err := sqlstore.New(db, sqlstore.SQLite, sqlstore.Options{Prefix: cfg.TablePrefix, Now: cfg.Now, OnResolve: cfg.OnResolve})
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return &Store{sql: s}, nil
}

// Mark records, inside tx, that consumer processed the event key, and returns
// false when it was already marked (framework.Store).
func (s *Store) Mark(ctx context.Context, tx *framework.Tx, consumer string, key framework.Key) (bool, error) {
	return s.sql.Mark(ctx, tx, consumer, key)
}

// MarkMany records, inside tx and in one statement, that consumer
// processed each of keys, and reports for each whether its mark is new (a
// repeat within keys is not). Group commit marks a batch's events with it
// when the store has it.
func (s *Store) MarkMany(ctx context.Context, tx *framework.Tx, consumer string, keys []framework.Key) ([]bool, error) {
	return s.sql.MarkMany(ctx, tx, consumer, keys)
}

// Count records one more delivery of key to consumer, in a transaction of
// its own, and returns the deliveries seen so far (framework.Store).
func (s *Store) Count(ctx context.Context, consumer string, key framework.Key, first int) (int, error) {
	return s.sql.Count(ctx, consumer, key, first)
}

// Uncount takes back one delivery of key to consumer, in a transaction of
// its own, never below zero (framework.Store).
func (s *Store) Uncount(ctx context.Context, consumer string, key framework.Key) error {
	return s.sql.Uncount(ctx, consumer, key)
}

// Forget removes the delivery count of key inside tx, once its effect
// commits (framework.Store).
func (s *Store) Forget(ctx context.Context, tx *framework.Tx, consumer string, key framework.Key) error {
	return s.sql.Forget(ctx, tx, consumer, key)
}

// PublishDeadLetter stores dl durably, or counts a repeat of it, and forgets
// its delivery count in the same transaction
// (framework.Store).
func (s *Store) PublishDeadLetter(ctx context.Context, dl framework.DeadLetter) error {
	return s.sql.PublishDeadLetter(ctx, dl)
}

// DeadLetter returns the dead letter with id, or framework.ErrNotFound
// (framework.Store).
func (s *Store) DeadLetter(ctx context.Context, id int64) (framework.DeadLetter, error) {
	return s.sql.DeadLetter(ctx, id)
}

// DeadLetters lists the dead letters that match f, oldest first
// (framework.Store).
func (s *Store) DeadLetters(ctx context.Context, f framework.DeadLetterFilter) ([]framework.DeadLetter, error) {
	return s.sql.DeadLetters(ctx, f)
}

// ResolveDeadLetter moves the pending dead letter id to r.Status
// (replayed or discarded) and appends r to its history, with, for a
// replay, its message to the consumer alone, in one transaction; it
// returns the dead letter as it was, framework.ErrNotFound, or
// framework.ErrNotPending naming its status (framework.Store). Once it
// committed, it calls StoreConfig.OnResolve.
func (s *Store) ResolveDeadLetter(ctx context.Context, id int64, r framework.Resolution) (framework.DeadLetter, error) {
	return s.sql.ResolveDeadLetter(ctx, id, r)
}

// DeadLetterHistory returns every failure and resolution of the dead
// letter id, oldest first, or framework.ErrNotFound (framework.Store).
func (s *Store) DeadLetterHistory(ctx context.Context, id int64) ([]framework.HistoryEntry, error) {
	return s.sql.DeadLetterHistory(ctx, id)
}

// AddReplays records messages to hand to one consumer alone, in a
// transaction of its own (framework.Store).
func (s *Store) AddReplays(ctx context.Context, rs []framework.Replay) error {
	return s.sql.AddReplays(ctx, rs)
}

// ClaimReplays takes a lease on up to limit of the oldest unsent replays
// and returns them (framework.Store).
func (s *Store) ClaimReplays(ctx context.Context, limit int, lease time.Duration) ([]framework.Replay, error) {
	return s.sql.ClaimReplays(ctx, limit, lease)
}

// ReplaySent records that the replay id was published (framework.Store).
func (s *Store) ReplaySent(ctx context.Context, id int64) error {
	return s.sql.ReplaySent(ctx, id)
}

// Advance moves the checkpoint of (consumer, subject) to seq inside tx when
// seq is greater, and reports whether it moved (framework.Store).
func (s *Store) Advance(ctx context.Context, tx *framework.Tx, consumer, subject string, seq int64) (bool, error) {
	return s.sql.Advance(ctx, tx, consumer, subject, seq)
}

// Checkpoint returns the sequence of (consumer, subject) that took effect
// last, 0 when none did, and holds it for tx (framework.Store).
func (s *Store) Checkpoint(ctx context.Context, tx *framework.Tx, consumer, subject string) (int64, error) {
	return s.sql.Checkpoint(ctx, tx, consumer, subject)
}

// WaitGap records that the event key with sequence seq waits for an earlier
// one of its subject, and returns for how long it has waited
// (framework.Store).
func (s *Store) WaitGap(ctx context.Context, consumer, subject string, seq int64, key framework.Key, body []byte) (time.Duration, error) {
	return s.sql.WaitGap(ctx, consumer, subject, seq, key, body)
}

// EndWait removes the wait of (consumer, subject, seq) and the hold or
// parking of the event key there, inside tx when tx is not nil, and
// reports whether events of the subject are parked after seq; another
// event's place there is framework.ErrSequenceTaken (framework.Store).
func (s *Store) EndWait(ctx context.Context, tx *framework.Tx, consumer, subject string, seq int64, key framework.Key) (bool, error) {
	return s.sql.EndWait(ctx, tx, consumer, subject, seq, key)
}

// HoldDeadLetter stores dl as PublishDeadLetter does and, in the same
// transaction, holds its subject: the later events of the subject wait
// behind it (framework.Store).
func (s *Store) HoldDeadLetter(ctx context.Context, dl framework.DeadLetter) error {
	return s.sql.HoldDeadLetter(ctx, dl)
}

// Park parks p inside tx, when an earlier event of its subject is held or
// parked, and reports whether it did (framework.Store).
func (s *Store) Park(ctx context.Context, tx *framework.Tx, p framework.ParkedEvent) (bool, error) {
	return s.sql.Park(ctx, tx, p)
}

// ParkGap parks p, which waits for an earlier event of its subject, in
// a transaction of its own, unless its turn came meanwhile, and reports
// whether it did (framework.Store).
func (s *Store) ParkGap(ctx context.Context, p framework.ParkedEvent) (bool, error) {
	return s.sql.ParkGap(ctx, p)
}

// Parked lists the held and parked events that match f (framework.Store).
func (s *Store) Parked(ctx context.Context, f framework.ParkedFilter) ([]framework.ParkedEvent, error) {
	return s.sql.Parked(ctx, f)
}

// Skip ends the hold of the dead letter key without its effect and
// returns its sequence (framework.Store).
func (s *Store) Skip(ctx context.Context, consumer, subject string, key framework.Key) (int64, error) {
	return s.sql.Skip(ctx, consumer, subject, key)
}

// Adopt gives consumer the processed marks, subject checkpoints,
// delivery counts and dead letters of the consumer it was renamed from, in
// one transaction, and returns how many marks it adopted
// (framework.Store).
func (s *Store) Adopt(ctx context.Context, consumer, from string) (int64, error) {
	return s.sql.Adopt(ctx, consumer, from)
}

// PurgeProcessed deletes up to limit of the oldest marks processed before
// before, and returns how many it deleted (framework.Store).
func (s *Store) PurgeProcessed(ctx context.Context, before time.Time, limit int) (int64, error) {
	return s.sql.PurgeProcessed(ctx, before, limit)
}
