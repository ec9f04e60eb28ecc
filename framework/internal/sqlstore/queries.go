package sqlstore

import (
	"strings"

	"github.com/jmoiron/sqlx"
)

// The store's SQL. "{p}" stands for the table prefix; placeholders are
// written as "?" and rebound for the dialect. Both dialects support
// INSERT ... ON CONFLICT and RETURNING.
const (
	// On PostgreSQL, ON CONFLICT DO NOTHING waits for a concurrent
	// transaction that inserted the same key: when it commits, nothing is
	// inserted (a duplicate); when it rolls back, this insert goes ahead.
	// On SQLite, the transaction holds the file's write lock since BEGIN
	// IMMEDIATE, so no other mark can be in flight.
	qMark = `INSERT INTO {p}processed_events (consumer, source, event_id, processed_at)
VALUES (?, ?, ?, ?)
ON CONFLICT (consumer, source, event_id) DO NOTHING`

	qForgetDelivery = `DELETE FROM {p}deliveries WHERE consumer = ? AND source = ? AND event_id = ?`
)

// queries turns the store's SQL into one dialect's and prefix's.
type queries struct {
	prefix *strings.Replacer
	bind   int
}

func newQueries(d Dialect, prefix string) queries {
	return queries{prefix: strings.NewReplacer("{p}", prefix), bind: d.bindType()}
}

// sql returns s with the prefix and the dialect's placeholders.
func (q queries) sql(s string) string { return sqlx.Rebind(q.bind, q.prefix.Replace(s)) }
