package sqlstore

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// qIndexScansOnly leaves PostgreSQL's planner, until the transaction
// ends, no scan of a table but through its indexes (set_config(...,
// true) is SET LOCAL).
//
// The claims of unsent outbox rows and replays read the oldest rows of a
// partial index on unsent rows (ORDER BY id LIMIT n). In a table never
// analyzed (a new one, or one filled faster than autovacuum looks, once a
// minute), the planner guesses that a small share of its rows is unsent:
// fewer than the limit, for which it reads every unsent row with a bitmap
// scan and sorts them all, 100 ms and 40 MB of temporary files for a
// claim of 1,000 with 100,000 rows waiting, against 2 ms through the
// index, and more the longer the backlog.
const qIndexScansOnly = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// indexScansOnly runs qIndexScansOnly in tx, on PostgreSQL; a claim
// made after it in tx reads no more rows than it takes, whatever the
// table's statistics say.
func indexScansOnly(ctx context.Context, tx sqlx.QueryerContext) error {
	var seqscan, bitmapscan string
	if err := tx.QueryRowxContext(ctx, qIndexScansOnly).Scan(&seqscan, &bitmapscan); err != nil {
		return fmt.Errorf("plan by index: %w", err)
	}
	return nil
}
