package sqlstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/internal/bound"
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

// qIndexScansOnlyIdle is qIndexScansOnly that also sets, until the
// transaction ends, how long the server lets it wait idle between two
// statements before it ends the session (SET LOCAL
// idle_in_transaction_session_timeout), in the same round trip.
const qIndexScansOnlyIdle = qIndexScansOnly + `, set_config('idle_in_transaction_session_timeout', $1, true)`

// indexScansOnly runs qIndexScansOnly in tx, on PostgreSQL; a claim made
// after it in tx reads no more rows than it takes, whatever the table's
// statistics say. With idle above 0 (qIndexScansOnlyIdle) the server also
// ends tx's session once tx waits idle longer than that between two
// statements (at most bound.PostgresMillis's most); 0 leaves the
// server's setting.
func indexScansOnly(ctx context.Context, tx sqlx.QueryerContext, idle time.Duration) error {
	query, args := qIndexScansOnly, []any(nil)
	if idle > 0 {
		query, args = qIndexScansOnlyIdle, []any{strconv.FormatInt(bound.PostgresMillis(idle), 10)}
	}
	if _, err := tx.QueryRowxContext(ctx, query, args...).SliceScan(); err != nil {
		return fmt.Errorf("plan by index: %w", err)
	}
	return nil
}
