package app

import (
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/outbox"
)

// newOutbox returns the outbox of the application's database, whose
// table carries the configured prefix. Handlers take it as a dependency
// and call Add to publish events with their transaction's writes; the
// runner's outbox relay publishes them (see newRouter).
func newOutbox(db *sqlx.DB, cfg Config) (*outbox.Outbox, error) {
	box, err := outbox.New(db, outbox.Config{TablePrefix: cfg.TablePrefix})
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return box, nil
}
