package postgres

//go:generate go run ../../internal/tools/storegen

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
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
	OnResolve func(dl driver.DeadLetter, r driver.Resolution)
}

// ErrMissingDB is returned by NewStore without a database.
var ErrMissingDB = errors.New("postgres: missing database (try postgres.Open)")

// Store keeps processed marks, delivery counts, dead letters, subject
// checkpoints and waits in a PostgreSQL database migrated by
// framework/migrate. It implements every store interface of package
// framework.
//
// Mark and Forget run in the attempt's transaction, so the unit of work
// must be given the same database. When two transactions mark the same
// key, the second waits for the first (INSERT ... ON CONFLICT DO NOTHING):
// it finds a duplicate when the first commits and takes the mark when the
// first rolls back. Times are timestamptz, written in UTC, with
// PostgreSQL's microsecond precision.
//
// Its methods are those of driver.Store (with MarkMany, which group
// commit finds by type assertion), driver.Inspector, driver.Purger,
// driver.Gauges and driver.Leases: each runs the framework's one SQL
// implementation, shared with the other database, and names the
// interface it implements.
type Store struct {
	sql *sqlstore.Store
}

var (
	_ driver.Store     = (*Store)(nil)
	_ driver.Inspector = (*Store)(nil)
	_ driver.Purger    = (*Store)(nil)
	_ driver.Gauges    = (*Store)(nil)
	_ driver.Leases    = (*Store)(nil)
	_ interface {
		MarkMany(ctx context.Context, tx *driver.Tx, consumer string, keys []framework.Key) ([]bool, error)
	} = (*Store)(nil)
)

// NewStore returns a Store on db, which should come from Open.
func NewStore(db *sqlx.DB, cfg StoreConfig) (*Store, error) {
	if db == nil {
		return nil, ErrMissingDB
	}
	s, err := sqlstore.New(db, sqlstore.Postgres, sqlstore.Options{Prefix: cfg.TablePrefix, Now: cfg.Now, OnResolve: cfg.OnResolve})
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return &Store{sql: s}, nil
}
