package sqlite

import (
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
// Its methods are those of the framework's one SQL implementation, shared
// with the other database; each is documented on the framework interface
// it implements.
type Store struct {
	*sqlstore.Store
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
	s, err := sqlstore.New(db, sqlstore.SQLite, cfg.TablePrefix, cfg.Now)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return &Store{Store: s}, nil
}
