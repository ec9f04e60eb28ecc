package sqlstore

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

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

// qIndexScansOnlyIdle is qIndexScansOnly that also sets, until the
// transaction ends, how long the server lets it wait idle between two
// statements before it ends the session (SET LOCAL
// idle_in_transaction_session_timeout), in one round trip.
const qIndexScansOnlyIdle = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('idle_in_transaction_session_timeout', $1, true)`

// maxIdleMillis is the most idle_in_transaction_session_timeout takes,
// in milliseconds (PostgreSQL's INT_MAX, about 24.8 days): a larger value
// fails the statement that sets it.
const maxIdleMillis = math.MaxInt32

// indexScansOnlyIdle is indexScansOnly, and the server ends tx's session
// once tx waits idle longer than idle between two statements (at most
// maxIdleMillis); idle 0 leaves the server's setting.
func indexScansOnlyIdle(ctx context.Context, tx sqlx.QueryerContext, idle time.Duration) error {
	if idle <= 0 {
		return indexScansOnly(ctx, tx)
	}
	ms := strconv.FormatInt(min(max(idle.Milliseconds(), 1), maxIdleMillis), 10)
	var seqscan, bitmapscan, timeout string
	if err := tx.QueryRowxContext(ctx, qIndexScansOnlyIdle, ms).Scan(&seqscan, &bitmapscan, &timeout); err != nil {
		return fmt.Errorf("plan by index, bound the idle transaction: %w", err)
	}
	return nil
}
